"""Tolerance for what is merely new: the top-level fields a request carries that its dialect's Struct does
not declare are ignored, logged at debug level and counted for /metrics; tools of a kind the model cannot be
offered (server tools, MCP, namespaces, custom grammars …) are dropped with one warning naming them.

Invariant: only names are counted, never values, and at most `MAX_NAMES` distinct names per dialect
(later ones count as "_other"), so a client cannot grow the metrics without bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from runtime.log import get_logger

__all__ = ["MAX_NAMES", "UnknownFields", "declared", "not_offered", "top_level_keys"]

log = get_logger(__name__)

MAX_NAMES = 64
MAX_NAME_LENGTH = 64
OTHER = "_other"
_keys = msgspec.json.Decoder(dict[str, msgspec.Raw])


def declared(struct: type[msgspec.Struct]) -> frozenset[str]:
    """The field names a Struct decodes (their wire names)."""
    return frozenset(f.encode_name for f in msgspec.structs.fields(struct))


def top_level_keys(body: bytes) -> list[str]:
    """The keys of a JSON object body (values left undecoded); [] when it is not an object."""
    try:
        return list(_keys.decode(body))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


class UnknownFields:
    """Counts of ignored top-level fields by (dialect, field name), bounded (module docstring)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._names: dict[str, set[str]] = {}

    def note(self, api: str, body: bytes, known: frozenset[str]) -> list[str]:
        """Count (and log) the top-level fields of `body` not in `known`; returns their names."""
        unknown = [k for k in top_level_keys(body) if k not in known]
        if not unknown:
            return []
        names = self._names.setdefault(api, set())
        for name in unknown:
            name = name[:MAX_NAME_LENGTH]
            if name not in names and len(names) >= MAX_NAMES:
                name = OTHER
            else:
                names.add(name)
            self.counts[(api, name)] += 1
        log.debug("serve.fields_ignored", api=api, fields=unknown[:MAX_NAMES])
        return unknown


def not_offered(api: str, kinds: Iterable[str]) -> None:
    """One warning naming the tools the model is not offered (their types or names)."""
    listed = sorted(set(kinds))
    if listed:
        log.warning("serve.tools_not_offered", api=api, tools=listed)
