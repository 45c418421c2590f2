"""The stored form of a session: a 12-byte header, then the session's msgpack bytes.

    offset  size  field
    0       3     magic b"\\xc1TS" (0xc1 is a byte msgpack never uses, so no plain record starts so)
    3       1     format version (1)
    4       4     body length, big-endian
    8       4     CRC-32 of the body, big-endian
    12      n     msgspec msgpack of the `Session`

A record without the magic is read as the previous format (plain msgpack, no checksum) so stores
written before the header keep working; every write uses the header. Nothing here is ever unpickled.
"""

from __future__ import annotations

import struct
import zlib

import msgspec

from runtime.errors import SessionCorrupt, TurnstileError
from sessions.model import Session

__all__ = ["HEADER_SIZE", "MAGIC", "VERSION", "decode_record", "encode_record", "has_header"]

MAGIC = b"\xc1TS"
VERSION = 1
_HEADER = struct.Struct(">3sBII")
HEADER_SIZE = _HEADER.size
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Session)


def encode_record(session: Session) -> bytes:
    """The record for `session`: header (magic, version, length, CRC-32) and msgpack body."""
    body = _ENCODER.encode(session)
    return _HEADER.pack(MAGIC, VERSION, len(body), zlib.crc32(body)) + body


def has_header(data: bytes) -> bool:
    """Whether `data` starts like a checksummed record (rather than a previous-format one)."""
    return data[:1] == MAGIC[:1]


def decode_record(id: str, data: object) -> Session:
    """The session stored under `id`; `SessionCorrupt` (saying why) if `data` is not a sound record of it."""
    if not isinstance(data, bytes):
        raise SessionCorrupt(id, f"record is a {type(data).__name__}, not msgpack bytes")
    body = _body(id, data) if has_header(data) else data
    try:
        session = _DECODER.decode(body)
    except (msgspec.DecodeError, TurnstileError) as err:
        raise SessionCorrupt(id, str(err)) from None
    if session.id != id:
        raise SessionCorrupt(id, f"record holds session {session.id!r}")
    return session


def _body(id: str, data: bytes) -> bytes:
    if len(data) < HEADER_SIZE:
        raise SessionCorrupt(id, f"record of {len(data)} bytes is shorter than its {HEADER_SIZE}-byte header")
    magic, version, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SessionCorrupt(id, f"record header has an unknown magic {magic!r}")
    if version != VERSION:
        raise SessionCorrupt(id, f"record format version {version} is not {VERSION}")
    body = data[HEADER_SIZE:]
    if len(body) != length:
        raise SessionCorrupt(id, f"record body is {len(body)} bytes, its header says {length}")
    if zlib.crc32(body) != crc:
        raise SessionCorrupt(id, f"record checksum mismatch (CRC-32 {zlib.crc32(body):#010x}, header {crc:#010x})")
    return body
