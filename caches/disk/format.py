"""The disk tier's record format: raw bytes with a header and a checksum; nothing is pickled.

Layout (little-endian):

    offset  size  field
    0       4     magic b"TSKV"
    4       2     format version (1)
    6       1     kind: 1 state (tokens + payload), 2 index (tokens only: the state's header),
                  3 blocked state (its payload the body `caches.disk.cut` writes: all but its shared blocks),
                  4 block (the block's tokens + its cells' payload)
    7       1     reserved, 0
    8       2     F: length of the model fingerprint (UTF-8)
    10      4     S: length of the context settings
    14      4     N: token count
    18      8     P: payload length (an index record gives its state's P and holds no payload)
    26      F     fingerprint
            S     context settings (opaque bytes, e.g. b"n_ctx=8192;type_k=f16")
            4N    tokens, int32
            P     payload (state records only)
            4     CRC-32 (zlib) of everything before it

Magic and version come first and never move, so a record of another format version is recognised (and
refused) whatever else it holds. `decode` reads a record from a binary file object in order, checks
each field and the checksum, and raises `StateFormatError` with a short reason.

No intermediate copies of a payload: `encode_parts` takes the payload as one buffer or a list of
buffers and gives them back as parts to write (`PartsReader` hands them to diskcache in slices);
`decode` reads the payload into one uninitialised buffer (from `caches.buffers.STATE_BUFFERS`: the
memory of a freed state when there is one) and returns a read-only view of that buffer; from a file,
a large payload is read and checksummed in pieces by a few threads at once (`caches.disk.pread`: the
record's CRC-32 is its pieces' combined, so the format does not change), since one core's CRC-32 is
slower than the copy out of the page cache.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from caches.buffers import STATE_BUFFERS
from caches.disk.pread import PIECE, read_crc
from caches.tokens import tokens_from_bytes, tokens_to_bytes
from runtime.errors import StateFormatError

__all__ = [
    "KIND_BLOCK",
    "KIND_BLOCKED",
    "KIND_INDEX",
    "KIND_STATE",
    "MAGIC",
    "VERSION",
    "Buffer",
    "PartsReader",
    "Record",
    "RecordFile",
    "StateFormatError",
    "encode",
    "encode_parts",
    "record_head",
    "record_size",
    "tokens_to_bytes",
]

MAGIC = b"TSKV"
VERSION = 1
KIND_STATE = 1
KIND_INDEX = 2
KIND_BLOCKED = 3
KIND_BLOCK = 4
_BODY_KINDS = frozenset((KIND_STATE, KIND_BLOCKED, KIND_BLOCK))
"""Kinds whose records hold their payload (an index record gives its state's payload length only)."""

_HEAD = struct.Struct("<4sHBxHIIQ")
_CRC = struct.Struct("<I")
_CHUNK = 8 << 20  # payload bytes read (and checksummed while still in cache) at a time

Buffer = bytes | bytearray | memoryview
"""A contiguous byte buffer."""
Payload = Buffer | Sequence[Buffer]
"""One buffer, or buffers that make the payload one after the other."""


class RecordFile(Protocol):
    """What `decode` reads from: a binary file (`open(..., "rb")`, `io.BytesIO`)."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


BodyReader = Callable[[RecordFile, int, int], tuple[memoryview, int]]
"""Reads a record's payload of n bytes from the file, continuing the crc: (payload view, crc)."""


@dataclass(frozen=True, slots=True)
class Record:
    kind: int
    tokens: tuple[int, ...]
    payload_len: int
    payload: memoryview
    """A read-only view of the buffer the payload was read into; empty for an index record."""


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def record_size(kind: int, fingerprint: str | bytes, settings: str | bytes, n_tokens: int, payload_len: int) -> int:
    """The encoded size of a record, in bytes."""
    body = payload_len if kind in _BODY_KINDS else 0
    return _HEAD.size + len(_as_bytes(fingerprint)) + len(_as_bytes(settings)) + 4 * n_tokens + body + _CRC.size


def encode_parts(
    kind: int,
    fingerprint: str | bytes,
    settings: str | bytes,
    tokens: Sequence[int],
    payload: Payload = b"",
    *,
    payload_len: int | None = None,
    token_bytes: bytes | None = None,
) -> list[Buffer]:
    """A record as a list of buffers to write one after the other (the payload's buffers are not copied).

    `payload` is one buffer or a list of buffers (the payload is their concatenation). An index record
    (`KIND_INDEX`) takes `payload_len` (its state's) and no payload.
    """
    fp, st = _as_bytes(fingerprint), _as_bytes(settings)
    tb = tokens_to_bytes(tokens) if token_bytes is None else token_bytes
    pieces = payload_parts(payload)
    if kind in _BODY_KINDS:
        body = pieces
        plen = sum(len(p) for p in pieces)
    else:
        body, plen = [], (payload_len if payload_len is not None else sum(len(p) for p in pieces))
    head = _HEAD.pack(MAGIC, VERSION, kind, len(fp), len(st), len(tb) // 4, plen)
    parts: list[Buffer] = [head, fp, st, tb, *body]
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    parts.append(_CRC.pack(crc))
    return parts


def encode(
    kind: int,
    fingerprint: str | bytes,
    settings: str | bytes,
    tokens: Sequence[int],
    payload: Payload = b"",
    *,
    payload_len: int | None = None,
    token_bytes: bytes | None = None,
) -> bytes:
    """A record as one `bytes`."""
    return b"".join(
        encode_parts(kind, fingerprint, settings, tokens, payload, payload_len=payload_len, token_bytes=token_bytes)
    )


def record_head(
    kind: int, fingerprint: str | bytes, settings: str | bytes, token_bytes: bytes, payload_len: int
) -> bytes:
    """What a record holds before its payload (header, fingerprint, settings, tokens), as `encode_parts`
    writes it: a record is exactly this, its payload and the CRC-32 of both."""
    fp, st = _as_bytes(fingerprint), _as_bytes(settings)
    head = _HEAD.pack(MAGIC, VERSION, kind, len(fp), len(st), len(token_bytes) // 4, payload_len)
    return head + fp + st + token_bytes


def payload_parts(payload: Payload) -> list[Buffer]:
    """The payload as a list of byte views (one per buffer), whichever form it came in."""
    items: Sequence[Buffer] = [payload] if isinstance(payload, bytes | bytearray | memoryview) else payload
    return [memoryview(p).cast("B") if isinstance(p, memoryview) and p.format != "B" else p for p in items]


class PartsReader:
    """A file-like `read(n)` over buffers, for diskcache's `set(..., read=True)` (no joined copy).

    Large buffers are handed on as views; runs of small ones (a blocked state's per-layer pieces: about
    200 of a few KiB each) are joined into one chunk of up to `_JOIN` bytes, one write instead of one per
    piece (a copy of only those few bytes)."""

    def __init__(self, parts: Sequence[Buffer]) -> None:
        self._parts = [p if isinstance(p, bytes) else memoryview(p).cast("B") for p in parts if len(p)]
        self._i = 0
        self._off = 0

    def read(self, n: int = -1) -> bytes | bytearray | memoryview:
        parts = self._parts
        if self._i >= len(parts):
            return b""
        part = parts[self._i]
        if self._off == 0 and len(part) < _SMALL and (n < 0 or n >= _JOIN):
            joined, i = bytearray(), self._i
            while i < len(parts) and len(parts[i]) < _SMALL and len(joined) + len(parts[i]) <= _JOIN:
                joined += parts[i]
                i += 1
            self._i = i
            return joined
        end = len(part) if n < 0 else min(len(part), self._off + n)
        chunk = memoryview(part)[self._off : end]
        self._off = end
        if self._off >= len(part):
            self._i, self._off = self._i + 1, 0
        return chunk


_SMALL, _JOIN = 64 << 10, 1 << 20


def _read_exact(f: RecordFile, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise StateFormatError("truncated", f"wanted {n} bytes, got {len(data)}")
    return data


def _fileno(f: RecordFile) -> int | None:
    """The file descriptor under `f`, or None if it is not a file (`io.BytesIO`)."""
    try:
        return int(f.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def _read_payload(f: RecordFile, n: int, crc: int) -> tuple[memoryview, int]:
    """Read `n` bytes into one pooled buffer, checksumming as they come; (read-only view, crc).

    From a file, a large payload is read and checksummed in pieces on the readers' pool (`pread`)."""
    view = STATE_BUFFERS.take(n)
    fd = _fileno(f) if n > 2 * PIECE else None
    if fd is not None:
        start = f.tell()  # type: ignore[attr-defined]
        crc = read_crc(fd, start, view, crc)
        f.seek(start + n)  # type: ignore[attr-defined]
        return view.toreadonly(), crc
    off = 0
    while off < n:
        got = f.readinto(view[off : min(n, off + _CHUNK)]) or 0
        if got <= 0:
            raise StateFormatError("truncated", f"wanted {n} payload bytes, got {off}")
        crc = zlib.crc32(view[off : off + got], crc)
        off += got
    return view.toreadonly(), crc


def decode(
    f: RecordFile,
    size: int,
    *,
    kind: int,
    fingerprint: str | bytes,
    settings: str | bytes,
    tokens: Sequence[int] | None = None,
    body: BodyReader | None = None,
) -> Record:
    """Read and check one record of `size` bytes; raise `StateFormatError` if this tier cannot use it.

    Magic and version first (they fix the layout); then the lengths in the header against `size` (a
    damaged length must not make us allocate gigabytes); then the whole record is read and its checksum
    checked; only then kind, fingerprint, settings and tokens, so that damage is reported as damage.

    `body(f, n, crc)` reads the payload instead of the default (one fresh buffer): it reads exactly `n`
    bytes, wherever it wants them, and returns (the view to give as `Record.payload`, the crc continued).
    """
    head = f.read(_HEAD.size)
    if len(head) < 6:
        raise StateFormatError("truncated", "header")
    if head[:4] != MAGIC:
        raise StateFormatError("magic")
    version = int.from_bytes(head[4:6], "little")
    if version != VERSION:
        raise StateFormatError("version", f"format {version}, this build reads {VERSION}")
    if len(head) < _HEAD.size:
        raise StateFormatError("truncated", "header")
    _, _, rec_kind, f_len, s_len, n_tok, p_len = _HEAD.unpack(head)
    n_body = p_len if rec_kind in _BODY_KINDS else 0
    want = _HEAD.size + f_len + s_len + 4 * n_tok + n_body + _CRC.size
    if want > size:
        raise StateFormatError("truncated", f"the header says {want} bytes, there are {size}")
    if want < size:
        raise StateFormatError("length", f"the header says {want} bytes, there are {size}")
    fp = _read_exact(f, f_len)
    st = _read_exact(f, s_len)
    tb = _read_exact(f, 4 * n_tok)
    crc = zlib.crc32(tb, zlib.crc32(st, zlib.crc32(fp, zlib.crc32(head))))
    payload, crc = (body or _read_payload)(f, n_body, crc)
    (stored,) = _CRC.unpack(_read_exact(f, _CRC.size))
    if stored != crc:
        raise StateFormatError("checksum", f"crc32 {stored:08x} != {crc:08x}")
    if rec_kind != kind:
        raise StateFormatError("kind", f"kind {rec_kind}, wanted {kind}")
    if fp != _as_bytes(fingerprint):
        raise StateFormatError("fingerprint", fp.decode("utf-8", "replace")[:80])
    if st != _as_bytes(settings):
        raise StateFormatError("settings", st.decode("utf-8", "replace")[:200])
    got = tokens_from_bytes(tb)
    if tokens is not None and tuple(tokens) != got:
        raise StateFormatError("tokens", "the record holds other tokens than its key")
    return Record(rec_kind, got, p_len, payload)
