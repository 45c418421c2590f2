"""A diskcache `Disk` that never unpickles: keys are str or bytes, values raw bytes, str, ints or files.

diskcache unpickles any row whose `mode` column says pickle (and any key stored with `raw = 0`), whatever
wrote it, so a crafted or damaged database would run code on read. `RawDisk` refuses those rows with
`UnsafeRecord` instead, and refuses to write anything that would need pickling. Every diskcache that
turnstile opens (session stores, the disk tier) passes `disk=RawDisk`.

diskcache also reads a row whose value file (a value kept beside the database) is missing as no row at
all: `Cache.get` turns the `OSError` into its default. `RawDisk` raises `MissingValueFile` instead, which
diskcache does not catch, so the caller sees a damaged row (a session store: `SessionCorrupt`; the disk
tier: a logged miss that removes the row), never a silent one.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import diskcache

from runtime.errors import MissingValueFile, UnsafeRecord

__all__ = ["SQLITE_SETTINGS", "RawDisk"]

# diskcache opens one SQLite connection per thread that touches a cache (a server's anyio worker threads: up to
# 40), each with its own page cache (diskcache's default: 8,192 pages, 32 MiB) and memory map (64 MiB), so the
# process's RSS could grow with every worker thread that had touched a store. turnstile's stores keep their
# index in memory (the disk tier's mirror) or read a few small rows a request (sessions, responses): each
# connection gets 2 MiB of page cache and no memory map (reads go through the OS page cache). The write-ahead
# log is truncated to 4 MiB after a checkpoint (SQLite keeps it at its largest size otherwise).
SQLITE_SETTINGS: dict[str, int] = {
    "sqlite_cache_size": 512,
    "sqlite_mmap_size": 0,
    "sqlite_journal_size_limit": 4 << 20,
}

_MODE_BINARY, _MODE_TEXT, _MODE_PICKLE = 2, 3, 4  # diskcache.core.MODE_*


class RawDisk(diskcache.Disk):  # type: ignore[misc]
    """diskcache's `Disk` without pickle: such rows raise `UnsafeRecord` and are never loaded."""

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str and type(key) is not bytes:
            raise UnsafeRecord(f"a {type(key).__name__} key would be pickled; keys must be str or bytes")
        return super().put(key)  # type: ignore[no-any-return]

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise UnsafeRecord("a key row is stored pickled (raw = 0); it is not loaded")
        return bytes(key) if type(key) is sqlite3.Binary else key

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not read and type(value) not in (bytes, str, int):
            raise UnsafeRecord(f"a {type(value).__name__} value would be pickled; store bytes")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == _MODE_PICKLE:
            raise UnsafeRecord(f"a value row is stored pickled (file {filename!r}); it is not loaded")
        try:
            return super().fetch(mode, filename, value, read)
        except OSError as err:
            if mode in (_MODE_BINARY, _MODE_TEXT) and filename:
                raise MissingValueFile(filename, f"{type(err).__name__}: {err.strerror or err}") from err
            raise
