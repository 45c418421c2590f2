"""Replay records on disk (`data_dir/replay/`), so a server restarted with the same data dir replays the replies
it generated before the restart exactly as it did before (`runtime.loop.replay`): a resent reply keeps its
generated tokens and the first turn after the restart finds its prefix in the disk tier.

One file a record, in one folder a key (tenant) namespace (`ns-<hex of the name>`): a 12-byte header, then a
msgspec msgpack body (the model's fingerprint, the namespace, the prompt and generated tokens as int32 bytes).

    offset  size  field
    0       3     magic b"\\xc1TR"
    3       1     format version (1)
    4       4     body length, big-endian
    8       4     CRC-32 of the body, big-endian
    12      n     msgpack of `Record`

Nothing is unpickled. A file that is damaged, from another model, in another namespace's folder, longer than
the limits or with a token id outside the vocabulary is refused (a `replay.record_refused` warning naming the
reason) and removed, never used. Least recently used first: a record's file time is its last use.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import zlib
from array import array
from pathlib import Path

import msgspec

from runtime.log import get_logger

__all__ = ["DiskRecords", "Loaded", "Record"]

log = get_logger(__name__)

MAGIC = b"\xc1TR"
VERSION = 1
_HEADER = struct.Struct(">3sBII")


class Record(msgspec.Struct, frozen=True):
    """One kept turn as stored: the tokens are int32 little-endian bytes (`array("i")`)."""

    fingerprint: str
    namespace: str
    prompt: bytes
    generated: bytes


Loaded = tuple[str, bytes, "array[int]", "array[int]"]  # (namespace, key, prompt, generated)

_DECODER = msgspec.msgpack.Decoder(Record)
_ENCODER = msgspec.msgpack.Encoder()


class DiskRecords:
    """The records of every namespace under `directory`, for one model (`fingerprint`, `n_vocab`)."""

    def __init__(self, directory: Path, *, fingerprint: str, n_vocab: int, max_tokens: int) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.n_vocab = n_vocab
        self.max_tokens = max_tokens

    def _folder(self, namespace: str) -> Path:
        return self.directory / ("ns-" + namespace.encode().hex())

    def _file(self, namespace: str, key: bytes) -> Path:
        return self._folder(namespace) / (hashlib.sha256(key).hexdigest()[:40] + ".rec")

    def load(self) -> list[Loaded]:
        """Every valid record, least recently used first (refused files are removed)."""
        found: list[tuple[int, str, Path]] = []
        if not self.directory.is_dir():
            return []
        for folder in self.directory.iterdir():
            if not folder.is_dir() or not folder.name.startswith("ns-"):
                continue
            for f in folder.glob("*.rec"):
                with contextlib.suppress(OSError):
                    found.append((f.stat().st_mtime_ns, f.name, f))
        out: list[Loaded] = []
        for _, _, f in sorted(found):
            got = self._read(f)
            if got is not None:
                out.append(got)
        return out

    def _read(self, f: Path) -> Loaded | None:
        try:
            data = f.read_bytes()
        except OSError as e:
            return self._refuse(f, f"unreadable: {e}")
        if len(data) < _HEADER.size:
            return self._refuse(f, "short")
        magic, version, length, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        if magic != MAGIC or version != VERSION:
            return self._refuse(f, "format")
        if len(body) != length or zlib.crc32(body) != crc:
            return self._refuse(f, "checksum")
        try:
            rec = _DECODER.decode(body)
        except msgspec.DecodeError:
            return self._refuse(f, "format")
        if rec.fingerprint != self.fingerprint:
            return self._refuse(f, "model")
        folder = f.parent.name
        if folder != self._folder(rec.namespace).name:
            return self._refuse(f, "namespace")
        if len(rec.prompt) % 4 or len(rec.generated) % 4 or not rec.prompt or not rec.generated:
            return self._refuse(f, "format")
        p, g = array("i"), array("i")
        p.frombytes(rec.prompt)
        g.frombytes(rec.generated)
        if len(p) + len(g) > self.max_tokens:
            return self._refuse(f, "size")
        if min(min(p), min(g)) < 0 or max(max(p), max(g)) >= self.n_vocab:
            return self._refuse(f, "vocabulary")
        key = p.tobytes()[-256:] + g.tobytes()
        if f.name != self._file(rec.namespace, key).name:
            return self._refuse(f, "name")
        return rec.namespace, key, p, g

    def _refuse(self, f: Path, reason: str) -> Loaded | None:
        log.warning("replay.record_refused", file=str(f), reason=reason)
        with contextlib.suppress(OSError):
            f.unlink()
        return None

    def write(self, namespace: str, key: bytes, prompt: array[int], generated: array[int]) -> None:
        """Keep a record (atomically: a temporary file renamed over the name). A failure is logged, not raised."""
        rec = Record(self.fingerprint, namespace, prompt.tobytes(), generated.tobytes())
        body = _ENCODER.encode(rec)
        f = self._file(namespace, key)
        tmp = f.with_suffix(".tmp")
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(_HEADER.pack(MAGIC, VERSION, len(body), zlib.crc32(body)) + body)
            os.replace(tmp, f)
        except OSError as e:
            log.warning("replay.record_not_written", file=str(f), error=str(e))
            with contextlib.suppress(OSError):
                tmp.unlink()

    def touch(self, namespace: str, key: bytes) -> None:
        """Mark a record used now (its place in the least-recently-used order after a restart)."""
        with contextlib.suppress(OSError):
            os.utime(self._file(namespace, key))

    def drop(self, namespace: str, key: bytes) -> None:
        """Remove a record's file (evicted)."""
        with contextlib.suppress(OSError):
            self._file(namespace, key).unlink()
