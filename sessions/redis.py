"""`RedisStore`: sessions in Redis, shared by every process (and machine) that reaches the server.

Each session is one Redis string at `prefix + id` holding the same checksummed record as the disk
store (`sessions.record`). A read-modify-write WATCHes the keys it reads and writes them in one
MULTI/EXEC; when another writer changed a watched key first, EXEC fails and the whole step runs again
on fresh data, so revision checks (`expected_revision`) hold across processes exactly as on disk.
Redis errors never escape: an unreachable, read-only, full or password-protected server raises
`StoreUnavailable` naming the server (never its password); a key that holds something other than a
sound record is `SessionCorrupt` for that id. Uses the `redis` client's sync API; a caller on an event
loop runs the store in a worker thread, like every store.

The session count is a counter key beside the sessions, `<prefix without its last ':'>#count` (a `#` is
never in a session id; for a prefix that ends in ':' the key is outside it, and listing skips it anyway),
shared by every process that uses the prefix: each transaction that creates or removes sessions adds the
difference (INCRBY) in the same MULTI/EXEC, so it holds across processes and crashes exactly as the
sessions do, and every other write reads it back (GET) in its MULTI. `count()` returns the figure the
store's last write (or its open) got back, from memory: it runs no command, so it never SCANs; another
process's changes show once this store next writes. The key is made once per keyspace: a store that
opens a prefix without it counts the sessions already there in one server-side script (a SCAN, atomic,
so no concurrent write is missed) and stores the figure; a `FLUSHDB` removes it with the sessions. A
session key set or deleted other than through a store (a `DEL`, an expiry, an older turnstile) is not
counted: the figure is then off until the counter key is deleted and a store opens again.
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
# The counter key's value, or the sessions under the prefix counted (and stored, if ARGV[2] is "1") when it is
# missing; atomic, like every script.
_COUNT_SESSIONS = """
local n = redis.call('GET', KEYS[1])
if n then return tonumber(n) end
local count, cursor = 0, '0'
repeat
  local reply = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = reply[1]
  for _, key in ipairs(reply[2]) do
    if key ~= KEYS[1] then count = count + 1 end
  end
until cursor == '0'
if ARGV[2] == '1' then redis.call('SET', KEYS[1], count) end
return count
"""


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
        self.count_key = (prefix.removesuffix(":") + "#count").encode()
        self._count = self._open_count()

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

    def count(self) -> int:
        """The shared session count as this store's last write (or its open) saw it: no command is run."""
        return self._count

    def _open_count(self) -> int:
        """The counter key's value; made from the sessions already there if it is missing (once per keyspace).
        A read-only server (a replica) gets the count without storing it."""
        run: Callable[..., object] = self._client.eval  # untyped in some redis versions
        with self._guard():
            try:
                n = run(_COUNT_SESSIONS, 1, self.count_key, self._pattern, "1")
            except redis.ReadOnlyError:
                n = run(_COUNT_SESSIONS, 1, self.count_key, self._pattern, "0")
        if not isinstance(n, int):  # pragma: no cover - a Lua number is always an integer reply
            raise StoreUnavailable(self.location, f"the session count script returned {n!r}")
        return n

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
            if key == self.count_key:  # under the pattern only for a prefix that does not end in ':'
                continue
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
    """`Records` in a Redis transaction: reads WATCH their keys, writes wait for `commit` (MULTI/EXEC).

    It knows which keys exist (every write follows a read of its key; a write that does not gets one), so
    `commit` adds the change in the session count to the counter key in the same MULTI/EXEC."""

    def __init__(self, store: RedisStore, pipe: redis.client.Pipeline) -> None:
        self._store = store
        self._pipe = pipe
        self._writes: dict[bytes, bytes | None] = {}
        self._present: dict[bytes, bool] = {}  # watched keys: whether they exist, with this transaction's writes
        self._delta = 0  # sessions created less sessions removed

    def _watch(self, id: str) -> bytes:
        key = self._store._key(id)
        if key in self._writes:  # pragma: no cover - no store operation reads after it writes
            raise RuntimeError("a transaction read a key after writing it")
        watch: Callable[..., object] = self._pipe.watch  # untyped in some redis versions
        watch(key)
        return key

    def read(self, id: str) -> Session | None:
        key = self._watch(id)
        session = self._store._get(self._pipe, id)
        self._present[key] = session is not None
        return session

    def contains(self, id: str) -> bool:
        key = self._watch(id)
        self._present[key] = found = bool(self._pipe.exists(key))
        return found

    def write(self, session: Session) -> None:
        key = self._store._key(session.id)
        if key not in self._present:
            self.contains(session.id)
        if not self._present[key]:
            self._present[key] = True
            self._delta += 1
        self._writes[key] = encode_record(session)

    def remove(self, id: str) -> bool:
        if not self.contains(id):
            return False
        key = self._store._key(id)
        self._writes[key] = None
        self._present[key] = False
        self._delta -= 1
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
        count_key = self._store.count_key
        if self._delta:
            self._pipe.incrby(count_key, self._delta)
        else:
            self._pipe.get(count_key)
        try:
            replies = self._pipe.execute()
        except redis.WatchError:
            log.debug("session.race", keys=[k.decode() for k in self._writes])
            return False
        self._store._count = int(replies[-1] or 0)  # a missing key (the keyspace flushed): 0
        return True


def _location(kwargs: dict[str, Any], connection_class: type) -> str:
    """The server as a URL without credentials, for messages."""
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    scheme = "rediss" if issubclass(connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
