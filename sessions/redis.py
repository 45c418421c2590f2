"""`RedisStore`: sessions in Redis, shared by every process (and machine) that reaches the server.

Each session is one Redis string at `prefix + id` holding the same checksummed record as the disk
store (`sessions.record`). A read-modify-write WATCHes the keys it reads and writes them in one
MULTI/EXEC; when another writer changed a watched key first, EXEC fails and the whole step runs again
on fresh data, so revision checks (`expected_revision`) hold across processes exactly as on disk.
Redis errors never escape: an unreachable, read-only, full or password-protected server raises
`StoreUnavailable` naming the server (never its password); a key that holds something other than a
sound record is `SessionCorrupt` for that id. Uses the `redis` client's sync API; a caller on an event
loop runs the store in a worker thread, like every store.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from runtime.errors import InvalidSessionId, StoreConfigError, StoreUnavailable
from runtime.log import get_logger
from sessions.base import Records, StoreBase, T
from sessions.model import Session, check_session_id
from sessions.record import encode_record

log = get_logger(__name__)

DEFAULT_PREFIX = "turnstile:session:"
# A read-modify-write that loses this many races in a row gives up (StoreUnavailable).
_MAX_RACES = 1000
_GLOB_SPECIAL = frozenset("*?[]\\")


class RedisStore(StoreBase):
    """A `SessionStore` over a `redis.Redis` client; `from_url` builds the client from a URL."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.time,
        close_client: bool = False,
    ) -> None:
        super().__init__(clock=clock)
        if not isinstance(client, redis.Redis):
            raise StoreConfigError(f"client must be a redis.Redis, not {type(client).__name__}")
        if not isinstance(prefix, str):
            raise StoreConfigError(f"prefix must be a str, not {type(prefix).__name__}")
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise StoreConfigError("the Redis client must not decode responses: records are bytes")
        self.prefix = prefix
        self.location = _location(kwargs, client.connection_pool.connection_class)
        self._client = client
        self._close_client = close_client
        self._pattern = "".join("\\" + c if c in _GLOB_SPECIAL else c for c in prefix) + "*"

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.time,
        **client_options: Any,
    ) -> RedisStore:
        """Connect to `redis://[:password@]host:port/db` (or `rediss://`, `unix://`) and check the server answers.

        `client_options` go to `redis.Redis.from_url` (defaults: 5 s to connect, 30 s per reply).
        Raises `StoreConfigError` for a URL it cannot use, `StoreUnavailable` if the server does not answer.
        """
        if not isinstance(url, str):
            raise StoreConfigError(f"Redis URL must be a str, not {type(url).__name__}")
        options: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": 30.0, **client_options}
        try:
            client = redis.Redis.from_url(url, **options)
        except (ValueError, TypeError) as err:
            raise StoreConfigError(f"cannot use Redis URL: {err}") from None
        try:
            store = cls(client, prefix=prefix, clock=clock, close_client=True)
        except BaseException:
            client.close()
            raise
        try:
            with store._guard():
                client.ping()
        except StoreUnavailable:
            store.close()
            raise
        return store

    def close(self) -> None:
        """Close the client's connections if the store made the client (`from_url`); else leave it open."""
        if self._close_client:
            self._client.close()

    # --- primitives ---------------------------------------------------------------------------------

    def _key(self, id: str) -> bytes:
        return (self.prefix + id).encode()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn the client's errors into `StoreUnavailable` naming the server."""
        try:
            yield
        except redis.RedisError as err:
            reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            log.error("store.unavailable", location=self.location, reason=reason)
            raise StoreUnavailable(self.location, reason) from err

    def _place(self) -> dict[str, str]:
        return {"location": self.location}

    def _get(self, client: redis.Redis | redis.client.Pipeline, id: str) -> Session | None:
        with self._guard():
            try:
                data = client.get(self._key(id))
            except redis.ResponseError as err:
                if not str(err).startswith("WRONGTYPE"):
                    raise
                raise self._corrupt(id, "the key holds a Redis value that is not a string") from None
        return self._decode(id, data)

    def _read(self, id: str) -> Session | None:
        return self._get(self._client, id)

    def _contains(self, id: str) -> bool:
        with self._guard():
            return bool(self._client.exists(self._key(id)))

    def _ids(self) -> builtins.list[str]:
        ids: set[str] = set()
        with self._guard():
            keys = builtins.list(self._client.scan_iter(match=self._pattern, count=1000))
        for key in keys:
            id = key[len(self.prefix.encode()) :].decode(errors="replace")
            try:
                ids.add(check_session_id(id))
            except InvalidSessionId:
                log.warning("store.bad_key", location=self.location, key=repr(key), reason="not a session id; skipped")
        return builtins.list(ids)

    def _transact(self, fn: Callable[[Records], T]) -> T:
        with self._guard():
            for _ in range(_MAX_RACES):
                with self._client.pipeline(transaction=True) as pipe:
                    records = _Watched(self, pipe)
                    result = fn(records)
                    if records.commit():
                        return result
        raise StoreUnavailable(self.location, f"{_MAX_RACES} attempts in a row lost the race to other writers")


class _Watched:
    """`Records` in a Redis transaction: reads WATCH their keys, writes wait for `commit` (MULTI/EXEC)."""

    def __init__(self, store: RedisStore, pipe: redis.client.Pipeline) -> None:
        self._store = store
        self._pipe = pipe
        self._writes: dict[bytes, bytes | None] = {}

    def _watch(self, id: str) -> bytes:
        key = self._store._key(id)
        if key in self._writes:  # pragma: no cover - no store operation reads after it writes
            raise RuntimeError("a transaction read a key after writing it")
        watch: Callable[..., object] = self._pipe.watch  # untyped in some redis versions
        watch(key)
        return key

    def read(self, id: str) -> Session | None:
        self._watch(id)
        return self._store._get(self._pipe, id)

    def contains(self, id: str) -> bool:
        return bool(self._pipe.exists(self._watch(id)))

    def write(self, session: Session) -> None:
        self._writes[self._store._key(session.id)] = encode_record(session)

    def remove(self, id: str) -> bool:
        key = self._watch(id)
        if not self._pipe.exists(key):
            return False
        self._writes[key] = None
        return True

    def commit(self) -> bool:
        """Apply the writes together; False if a watched key changed first (nothing was written)."""
        if not self._writes:
            return True
        self._pipe.multi()
        for key, value in self._writes.items():
            if value is None:
                self._pipe.delete(key)
            else:
                self._pipe.set(key, value)
        try:
            self._pipe.execute()
        except redis.WatchError:
            log.debug("session.race", keys=[k.decode() for k in self._writes])
            return False
        return True


def _location(kwargs: dict[str, Any], connection_class: type) -> str:
    """The server as a URL without credentials, for messages."""
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    scheme = "rediss" if issubclass(connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
