"""API keys as tenants: who made a request, and which session ids (and other stored ids) are theirs.

A `Keyring` holds the server's keys, each with a name; `Keyring.tenant(token)` compares the token with
every key in constant time (SHA-256 digests, `hmac.compare_digest` over all keys, no early exit) and
answers the key's `Tenant` or None. The auth middleware puts the tenant into the request scope, where
`tenant_of(request)` reads it.

A tenant's stored ids live in its own namespace: `Tenant.session_id(client_id)` maps the id a client
sees (an `X-Session-Id`, a response id) to the internal id, `Tenant.owns(internal_id)` tells whether an
internal id is the tenant's, `Tenant.client_id(internal_id)` maps back. Invariants:

- With one tenant (no key, or a single `--api-key`) the namespace is the identity: internal == client id.
- With several keys every tenant's internal ids start with `NAME@`. Names are `[A-Za-z0-9._-]` (no `@`),
  so the first `@` ends the prefix and an internal id of one tenant never equals another's; an id that
  belongs to another tenant is reported by the API as not found (404), never as forbidden.
- A key never appears in a name, a log line or a metric label: only the key's name does.

The key file (`turnstile serve --api-key-file PATH`) has one key a line, `NAME: KEY` or a bare `KEY`
(named `keyN`, N its line number), optionally followed by the key's quotas and weight as `SETTING=N`
words (`sessions=100 rpm=60 weight=2`, runtime.serve.http.quotas) and a `# comment`; blank lines and
lines starting with `#` are skipped. A damaged line
(a bad name, a key with spaces or non-printable characters, a duplicate key or name, an unknown or bad
setting) is an `InvalidKeyFile` naming the line number, never a silent skip.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import InvalidConfig, InvalidKeyFile, InvalidSessionId, TurnstileError
from runtime.serve.http.quotas import Quotas, parse_settings

__all__ = [
    "DEFAULT_TENANT",
    "SCOPE_KEY",
    "Keyring",
    "Tenant",
    "check_tenant_name",
    "parse_key_file",
    "parse_key_lines",
    "set_tenant",
    "tenant_of",
]

SCOPE_KEY = "turnstile.tenant"  # where the auth middleware puts the request's Tenant in the ASGI scope
DEFAULT_NAME = "default"
MAX_ID = 128  # sessions' id rule: 1 to 128 characters of [A-Za-z0-9._:@-]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@-]+")
_KEY = re.compile(r"[\x21-\x7e]{1,4096}")  # printable ASCII, no spaces (it travels in an HTTP header)


def check_tenant_name(name: object) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidConfig(f"key name {name!r} is not 1 to 64 characters of [A-Za-z0-9._-]")
    return name


@dataclass(frozen=True)
class Tenant:
    """One API key's owner: `name` (the key's name, never the key) and its id namespace `prefix`
    ("" when the server has one tenant, else `NAME@`)."""

    name: str
    prefix: str = ""

    def __post_init__(self) -> None:
        check_tenant_name(self.name)
        if self.prefix not in ("", f"{self.name}@"):
            raise InvalidConfig(f"tenant {self.name!r}: prefix must be '' or {self.name + '@'!r}")

    @property
    def namespace(self) -> str:
        """The namespace of this tenant's requests in the scheduler (`runtime.loop.fair`): "" with one tenant."""
        return self.name if self.prefix else ""

    def session_id(self, client_id: str) -> str:
        """The internal id for `client_id` in this tenant's namespace (InvalidSessionId, a 400, if the
        id is not 1 to 128 - len(prefix) characters of [A-Za-z0-9._:@-])."""
        if (
            not isinstance(client_id, str)
            or _CLIENT_ID.fullmatch(client_id) is None
            or len(self.prefix) + len(client_id) > MAX_ID
        ):
            raise InvalidSessionId(client_id)
        return self.prefix + client_id

    def owns(self, internal_id: str) -> bool:
        """Whether `internal_id` is in this tenant's namespace."""
        return (
            isinstance(internal_id, str) and len(internal_id) > len(self.prefix) and internal_id.startswith(self.prefix)
        )

    def client_id(self, internal_id: str) -> str:
        """The id the client knows for one of this tenant's internal ids (ValueError if not its own)."""
        if not self.owns(internal_id):
            raise InvalidSessionId(internal_id)
        return internal_id[len(self.prefix) :]


DEFAULT_TENANT = Tenant(DEFAULT_NAME)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class Keyring:
    """The server's API keys and their tenants. Empty: no key needed, every request is `DEFAULT_TENANT`."""

    def __init__(
        self,
        keys: Iterable[tuple[str, str]] = (),
        *,
        quotas: Mapping[str, Quotas] | None = None,
        defaults: Quotas | None = None,
    ) -> None:
        """`quotas`: a key name's quotas (and weight); `defaults`: every other key's (no limit, weight 1)."""
        pairs = list(keys)
        self.defaults = defaults if defaults is not None else Quotas()
        self._quotas = dict(quotas or {})
        names = [check_tenant_name(name) for name, _ in pairs]
        if len(set(names)) != len(names):
            raise InvalidConfig("two API keys have the same name")
        for name, key in pairs:
            if not isinstance(key, str) or _KEY.fullmatch(key) is None:
                raise InvalidConfig(f"API key {name!r}: want 1 to 4096 printable ASCII characters without spaces")
        if len({key for _, key in pairs}) != len(pairs):
            raise InvalidConfig("the same API key is given twice")
        shared = len(pairs) > 1
        self._entries = [(_digest(key.encode()), Tenant(name, f"{name}@" if shared else "")) for name, key in pairs]

    @classmethod
    def from_options(
        cls, api_key: str | None = None, key_file: str | Path | None = None, defaults: Quotas | None = None
    ) -> Keyring:
        """The keyring for `--api-key` (named "default") and `--api-key-file` together; `defaults`: the
        quotas of every key (`--quota`), a key file line's settings override them for its key."""
        keys = [(DEFAULT_NAME, api_key)] if api_key else []
        base = defaults if defaults is not None else Quotas()
        quotas: dict[str, Quotas] = {}
        if key_file is not None:
            for lineno, name, key, settings in parse_key_lines(key_file):
                try:
                    quotas[name] = base.with_settings(settings)
                except InvalidConfig as e:
                    raise InvalidKeyFile(key_file, lineno, str(e)) from None
                if name == DEFAULT_NAME and api_key:
                    raise InvalidKeyFile(key_file, lineno, f"the name {DEFAULT_NAME!r} is --api-key's")
                if api_key and hmac.compare_digest(_digest(key.encode()), _digest(api_key.encode())):
                    raise InvalidKeyFile(key_file, lineno, "this key is also given as --api-key")
                keys.append((name, key))
        return cls(keys, quotas=quotas, defaults=base)

    def quotas(self, name: str) -> Quotas:
        """A key's quotas and weight, by its name."""
        return self._quotas.get(name, self.defaults)

    def prefixes(self) -> dict[str, str]:
        """Each key name's session-id prefix."""
        return {t.name: t.prefix for t in self.tenants}

    @property
    def required(self) -> bool:
        """Whether requests need a key at all."""
        return bool(self._entries)

    @property
    def tenants(self) -> list[Tenant]:
        return [tenant for _, tenant in self._entries] or [DEFAULT_TENANT]

    def tenant(self, token: str | bytes | None) -> Tenant | None:
        """The tenant whose key is `token`, None if no key matches (every key is compared, in constant time)."""
        if not self._entries:
            return DEFAULT_TENANT
        given = _digest(token.encode() if isinstance(token, str) else (token or b""))
        found: Tenant | None = None
        for digest, tenant in self._entries:
            if hmac.compare_digest(given, digest) and token:
                found = tenant
        return found


def parse_key_file(path: str | Path) -> list[tuple[int, str, str]]:
    """(line number, name, key) for each key in the file; InvalidKeyFile naming the first damaged line."""
    return [(lineno, name, key) for lineno, name, key, _ in parse_key_lines(path)]


def parse_key_lines(path: str | Path) -> list[tuple[int, str, str, dict[str, int]]]:
    """(line number, name, key, quota settings) for each key in the file (InvalidKeyFile as parse_key_file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidKeyFile(path, 0, f"cannot read it: {e}") from e
    out: list[tuple[int, str, str, dict[str, int]]] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if ":" in line:
            name, _, key = (part.strip() for part in line.partition(":"))
            if _NAME.fullmatch(name) is None:
                raise InvalidKeyFile(path, lineno, "the name before ':' is not 1 to 64 characters of [A-Za-z0-9._-]")
        else:
            name, key = f"key{lineno}", line
        key, *rest = key.split(None, 1) or [""]
        words = rest[0].split("#", 1)[0].split() if rest else []  # settings, then a trailing "# comment"
        if words and "=" not in words[0]:
            raise InvalidKeyFile(path, lineno, "the key is not 1 to 4096 printable ASCII characters without spaces")
        try:
            settings = parse_settings(words)
        except (ValueError, InvalidConfig) as e:
            raise InvalidKeyFile(path, lineno, str(e)) from None
        if _KEY.fullmatch(key) is None:
            raise InvalidKeyFile(path, lineno, "the key is not 1 to 4096 printable ASCII characters without spaces")
        if name in names:
            raise InvalidKeyFile(path, lineno, f"the name {name!r} is already used on line {names[name]}")
        digest = _digest(key.encode())
        if digest in digests:
            raise InvalidKeyFile(path, lineno, f"the same key is already on line {digests[digest]}")
        names[name], digests[digest] = lineno, lineno
        out.append((lineno, name, key, settings))
    if not out:
        raise InvalidKeyFile(path, 0, "it holds no key")
    return out


def set_tenant(scope: MutableMapping[str, Any], tenant: Tenant) -> None:
    scope[SCOPE_KEY] = tenant


def tenant_of(request: Any) -> Tenant:
    """The tenant the auth middleware found for this request (a Starlette Request or an ASGI scope).

    Fails closed: a scope without a tenant (the middleware did not run) is a server error, never the
    default tenant, which would see every id when the server has one tenant.
    """
    scope: Mapping[str, Any] = request if isinstance(request, Mapping) else request.scope
    tenant = scope.get(SCOPE_KEY)
    if not isinstance(tenant, Tenant):
        raise TurnstileError("no tenant in the request scope: the auth middleware did not run")
    return tenant
