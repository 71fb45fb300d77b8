"""Write-ahead log records: their kinds, their framing on disk, and their bodies.

A frame is

    u32 length | u32 crc32c | u8 kind | u8 id length | id | body

where `length` counts kind..body and the CRC32C covers the same bytes. The id (unique per
record, chosen by its sender) sits outside the body so the writer can de-duplicate re-sent
records without decoding them. Bodies are msgpack maps; every body has `at`, and all but
ACCESS and FLOW a `session`.

Record bodies by kind (the store's projection reads exactly these fields):
- EVENT:       session, tenant, turn, seq, type, data (map), at
- CHECKPOINT:  session, tenant, turn, seq, full (bool), first (index of the first message in
               `messages`), messages (list of maps: role, content, ...), at — an agent session's
               state: the messages since the previous checkpoint, or all of them when `full`
- BLOB:        session, tenant, key, seq, payload (bytes), at — a checkpoint PUT by an external
               runtime, opaque to us
- ACCESS:      at, rows — the access rows of many HTTP requests, each [at, method, route,
               status, tenant, session, duration_ms] (logs written before 2026-12-01 hold one
               request per record: at, method, route, status, tenant, session, duration_ms)
- FLOW:        run, tenant, type, at, exec, and the fields of its type — a flow run's journal
               (the types and their fields are listed in actors/flow_state.py)
"""
from __future__ import annotations

import enum
import struct
from typing import Any, Iterator

import crc32c
import msgpack

_HEADER = struct.Struct("<IIBB")
HEADER_BYTES = _HEADER.size
MAX_RECORD_BYTES = 64 << 20


class RecordKind(enum.IntEnum):
    EVENT = 1
    CHECKPOINT = 2
    BLOB = 3
    ACCESS = 4
    FLOW = 5
    CLOSE = 6     # a session closed: its records before the logs' ends then leave (storage/session_closing.py)


KNOWN_KINDS = frozenset(int(k) for k in RecordKind)


class TornRecord(Exception):
    """The bytes at an offset are not a whole, valid record (a torn tail or corruption)."""


def frame(kind: int, record_id: bytes, body: bytes) -> bytes:
    if len(record_id) > 255:
        raise ValueError("record id longer than 255 bytes")
    head = bytes((kind, len(record_id))) + record_id
    if len(head) + len(body) > MAX_RECORD_BYTES:   # written, it would read back as a torn record
        raise ValueError(f"a record of {len(head) + len(body):,} bytes is over the log's limit of "
                         f"{MAX_RECORD_BYTES:,}")
    # the checksum runs on in pieces, so a checkpoint's body is copied once, into the frame
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return b"".join((struct.pack("<II", len(head) + len(body), crc), head, body))


def parse(buf: bytes | memoryview, offset: int) -> tuple[int, bytes, bytes, int]:
    """(kind, id, body, next offset) of the record at `offset`; TornRecord if it is not whole."""
    if len(buf) - offset < HEADER_BYTES:
        raise TornRecord("short header")
    length, crc = struct.unpack_from("<II", buf, offset)
    if length < 2 or length > MAX_RECORD_BYTES:
        raise TornRecord(f"impossible length {length}")
    end = offset + 8 + length
    if end > len(buf):
        raise TornRecord("short body")
    payload = bytes(buf[offset + 8:end])
    if crc32c.crc32c(payload) != crc:
        raise TornRecord("checksum mismatch")
    kind, id_len = payload[0], payload[1]
    if kind not in KNOWN_KINDS:
        raise TornRecord(f"unknown record kind {kind}")
    return kind, payload[2:2 + id_len], payload[2 + id_len:], end


def claimed_length(buf: bytes | memoryview, offset: int) -> int | None:
    """The bytes the record at `offset` says it takes, or None if its header is impossible
    (zeros, garbage) or not all there."""
    if len(buf) - offset < HEADER_BYTES:
        return HEADER_BYTES if len(buf) > offset and any(bytes(buf[offset:])) else None
    length = struct.unpack_from("<I", buf, offset)[0]
    return 8 + length if 2 <= length <= MAX_RECORD_BYTES else None


def next_whole(buf: bytes | memoryview, offset: int) -> int | None:
    """The offset of the first whole record after `offset` (where one failed to parse), or None:
    how a reader gets past a damaged record in data known to be whole. A candidate must claim a
    possible length that fits and pass its CRC32C, so a false find is about 1 in 2**32 of the
    candidates; most offsets fail at the length (zeros, text) for a compare."""
    last = len(buf) - HEADER_BYTES
    unpack = struct.unpack_from
    for at in range(offset + 1, last + 1):
        length = unpack("<I", buf, at)[0]
        if length < 2 or length > MAX_RECORD_BYTES or at + 8 + length > len(buf):
            continue
        try:
            parse(buf, at)
        except TornRecord:
            continue
        return at
    return None


def scan(buf: bytes | memoryview, offset: int = 0) -> Iterator[tuple[int, int, bytes, bytes, int]]:
    """(offset, kind, id, body, next offset) of every whole record; stops at the first torn one."""
    while offset < len(buf):
        try:
            kind, record_id, body, nxt = parse(buf, offset)
        except TornRecord:
            return
        yield offset, kind, record_id, body, nxt
        offset = nxt


_pack = msgpack.Packer(use_bin_type=True).pack


def encode_body(body: dict) -> bytes:
    return _pack(body)


def decode_body(raw: bytes) -> dict:
    body = msgpack.unpackb(raw, raw=False)
    if not isinstance(body, dict):
        raise ValueError("record body is not a map")
    return body


def head_fields(head: bytes, wanted: tuple[str, ...]) -> dict[str, Any]:
    """The `wanted` fields of a record body's map found in its first bytes (`head`), read until
    all are found: a field past them (after a big input or payload) is simply not found, and
    bytes that do not decode as a map's first entries give what was found before them."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(head)
    found: dict[str, Any] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in wanted:
                found[key] = unpacker.unpack()
                if len(found) == len(wanted):
                    break
            else:
                unpacker.skip()
    except (msgpack.UnpackException, ValueError, TypeError):
        pass
    return found
