"""The disk tier's directory: a diskcache that never unpickles, with a change counter and a change log.

Rows (every key a `str`, every value raw bytes, `str` or `int`; `RawDisk` refuses anything pickled):

- `turnstile:i:<d>`, `turnstile:u:<d>`, `turnstile:r:<d>`: an entry's index record, usage and state record
  (see `caches.disk.tier`); `turnstile:k:<d>` its manifest when it is stored as blocks, and
  `turnstile:b:<key hex>` each block record (`caches.disk.cut`);
- `turnstile-meta:seq`: an `int`, one more in every write transaction that changes an entry;
- `turnstile-meta:log:<seq>`: the digests that transaction changed, space-separated (the last `LOG_KEEP`).

A process that has seen `seq = s` and now reads `s' > s` reads the log rows `s+1 .. s'` and refreshes
those entries only; a gap (the log was trimmed, the counter went back) means a full reload. Reading the
counter is one indexed SQLite lookup, so staying consistent with other processes costs nothing while
nobody else writes.

A write transaction that fails removes the files it created (diskcache writes a value's file before its
row, and leaves it behind if the write or the transaction fails: a full disk would leak space outside
the byte limit's accounting).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import diskcache

from runtime.errors import DiskTierUnavailable, UnsafeRecord
from sessions.raw_disk import SQLITE_SETTINGS, RawDisk

__all__ = [
    "BLK",
    "IDX",
    "LOG_KEEP",
    "MAN",
    "REC",
    "STORE_ERRORS",
    "USE",
    "WRITE_ERRORS",
    "TierDisk",
    "TierStore",
    "Txn",
]

IDX, USE, REC = "turnstile:i:", "turnstile:u:", "turnstile:r:"
MAN, BLK = "turnstile:k:", "turnstile:b:"
SEQ = "turnstile-meta:seq"
LOG = "turnstile-meta:log:"
LOG_KEEP = 1024
_MODE_BINARY = 2  # diskcache.core.MODE_BINARY: raw bytes in a value file
BAD_SEQ = -2
"""`seq()` of a counter row that is not a plain int: never equal to a counter seen, so readers reload."""

STORE_ERRORS: tuple[type[Exception], ...] = (OSError, sqlite3.Error, diskcache.Timeout)
"""What a directory operation raises when the disk or the database fails (not a bad record)."""
WRITE_ERRORS: tuple[type[Exception], ...] = (*STORE_ERRORS, UnsafeRecord)
"""What a write can raise: the above, or a value that would have to be pickled."""


class TierDisk(RawDisk):
    """`RawDisk` that lists the value files it creates while a write transaction is open."""

    created: list[str] | None = None

    def filename(self, key: Any = diskcache.core.UNKNOWN, value: Any = diskcache.core.UNKNOWN) -> tuple[str, str]:
        name, full_path = super().filename(key, value)
        if self.created is not None:
            self.created.append(name)
        return name, full_path


@dataclass(slots=True)
class Txn:
    """An open write transaction: the counter it started from and the digests it changed."""

    base: int
    changed: set[str] = field(default_factory=set)
    seq: int = -1
    """The counter after commit."""


class TierStore:
    """The directory's diskcache, opened with `TierDisk`; callers serialise writes (one lock)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.cache: Any = diskcache.Cache.__new__(diskcache.Cache)
        try:
            self.cache.__init__(
                directory, disk=TierDisk, eviction_policy="none", cull_limit=0, statistics=False, **SQLITE_SETTINGS
            )
        except STORE_ERRORS as e:
            with contextlib.suppress(Exception):
                self.cache.close()  # the connection it opened before failing
            raise DiskTierUnavailable(directory, f"{type(e).__name__}: {e}") from e
        self.disk: TierDisk = self.cache.disk
        self.txn: Txn | None = None

    def close(self) -> None:
        self.cache.close()

    def get(self, key: str, *, read: bool = False) -> Any:
        """The row's value (None if absent); `UnsafeRecord` if it is pickled."""
        return self.cache.get(key, default=None, read=read)

    def put(self, key: str, value: Any, *, read: bool = False) -> None:
        self.cache.set(key, value, read=read)

    def delete(self, key: str) -> None:
        self.cache.delete(key)

    def seq(self) -> int:
        """The change counter (0 in a directory no tier of this version has written)."""
        try:
            value = self.cache.get(SEQ, default=0)
        except UnsafeRecord:
            return BAD_SEQ
        return value if type(value) is int and value >= 0 else BAD_SEQ

    def changes(self, since: int, upto: int) -> set[str] | None:
        """The digests changed by the transactions `since+1 .. upto`, or None if the log cannot say."""
        if since < 0 or upto < since or upto - since > LOG_KEEP:
            return None
        out: set[str] = set()
        for s in range(since + 1, upto + 1):
            try:
                row = self.cache.get(LOG + str(s), default=None)
            except UnsafeRecord:
                row = None
                if self.txn is not None:
                    self.cache.delete(LOG + str(s))  # never loaded; a reload does without it
            if not isinstance(row, str):
                return None
            out.update(row.split())
        return out

    def scan(self, prefix: str, *, values: bool = True) -> list[tuple[str, Any]]:
        """(key, value) of every `str` key starting with `prefix`, in key order, from one indexed query.

        Values go through `TierDisk.fetch`, so a pickled row gives its exception (`UnsafeRecord`) in place
        of a value, as does an unreadable file (`OSError`); nothing is unpickled. `values=False`: keys only.
        """
        hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self.cache._sql(  # one range query on diskcache's (key, raw) index; pickled keys are blobs
            "SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key >= ? AND key < ?", (prefix, hi)
        ).fetchall()
        out: list[tuple[str, Any]] = []
        for key, mode, filename, value in rows:
            if not isinstance(key, str):
                continue
            if not values:
                out.append((key, None))
                continue
            try:
                out.append((key, self.disk.fetch(mode, filename, value, False)))
            except Exception as e:  # UnsafeRecord, OSError: the caller removes the row and says why
                out.append((key, e))
        return out

    def locate(self, keys: Sequence[str]) -> dict[str, str | Any]:
        """Where each present row of `keys` is, in one indexed query per 500 keys: the full path of its value
        file (a value kept beside the database), else its value (raw bytes, a `str`, an `int`) or the
        exception reading it gives (`UnsafeRecord` for a pickled row). Absent rows are not in the result.

        A file found here may be gone when it is opened (a row removed meanwhile): the caller sees that."""
        out: dict[str, str | Any] = {}
        for i in range(0, len(keys), 500):
            chunk = list(keys[i : i + 500])
            marks = ",".join("?" * len(chunk))
            rows = self.cache._sql(
                f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN ({marks})", chunk
            ).fetchall()
            for key, mode, filename, value in rows:
                if mode == _MODE_BINARY and filename:
                    out[key] = os.path.join(self.directory, filename)
                    continue
                try:
                    out[key] = self.disk.fetch(mode, filename, value, False)
                except Exception as e:  # UnsafeRecord, OSError: the caller rejects the row and says why
                    out[key] = e
        return out

    def sweep_files(self) -> int:
        """In a write transaction: remove the value files no row refers to; how many.

        A writer killed between writing a value's file and committing its row leaves the file behind,
        outside the byte limit's accounting. Tiers write files only inside their write transaction, so
        while we hold it no file is half-way to its row.
        """
        rows = self.cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()
        referenced = {name for (name,) in rows}
        removed, root = 0, os.path.join(self.directory, "")
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name.endswith(".val"):
                    rel = os.path.join(dirpath, name)[len(root) :]
                    if rel not in referenced:
                        self.disk.remove(rel)
                        removed += 1
        return removed

    @contextlib.contextmanager
    def write(self) -> Iterator[Txn]:
        """A write transaction (nested calls share the outer one); bumps the counter and logs the changes."""
        if self.txn is not None:
            yield self.txn
            return
        self.disk.created = []
        try:
            with self.cache.transact():
                seq = self.seq()
                txn = self.txn = Txn(max(seq, 0))
                yield txn
                txn.seq = txn.base
                if txn.changed or seq == BAD_SEQ:
                    txn.seq = txn.base + 1
                    self.cache.set(LOG + str(txn.seq), " ".join(sorted(txn.changed)))
                    if txn.seq > LOG_KEEP:
                        self.cache.delete(LOG + str(txn.seq - LOG_KEEP))
                    self.cache.set(SEQ, txn.seq)
        except BaseException:
            self._abandon()
            raise
        finally:
            self.txn = None
            self.disk.created = None

    def _abandon(self) -> None:
        """After a failed transaction: roll back what a failed COMMIT left open, remove the files it made."""
        con = self.cache._con
        if con.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
        for name in self.disk.created or ():
            self.disk.remove(name)
