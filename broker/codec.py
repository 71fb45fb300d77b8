"""The codec of the bus protocol (its kinds and their fields: broker/protocol.py).

A message is one ZeroMQ frame (an envelope) laid out so that the broker can route it without
decoding anything but the first name:

    PROTO (5 bytes) | u8 name length | name | u8 kind length | kind | u16 header length | header | body

From a peer to the broker `name` is the destination; the broker swaps it for the sender's name
and forwards the rest byte for byte. The header is a msgpack array [id, sent_at, reply_to,
session, turn] and, for a big body spilled into shared memory, a sixth item saying where
(broker/spill.py; the body is then empty); the body a msgpack map whose fields each kind
declares in `SPECS` (broker/bodies.py). Decoding
rejects another major protocol version and missing or mistyped required fields, and ignores
unknown fields, so adding a field is never a breaking change. No pickle anywhere.

One frame rather than a multipart list: pyzmq's multipart helpers cost ~20 µs per message on
these machines (enum conversions per part), a single frame under 1 µs.
"""
from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING, Any

import msgpack

from broker.bodies import SPECS
from broker.protocol import KIND_BYTES, MAX_NAME_BYTES, PROTO, PROTO_FAMILY, Kind, Message, ProtocolError

if TYPE_CHECKING:
    from broker.spill import SpillReader

_NUM = (int, float)
_KIND_BY_BYTES: dict[bytes, Kind] = {v: k for k, v in KIND_BYTES.items()}

_packb = msgpack.Packer(use_bin_type=True).pack
_U16 = struct.Struct("<H")
_KIND_PREFIX: dict[Kind, bytes] = {k: bytes([len(v)]) + v for k, v in KIND_BYTES.items()}
_NAME_PREFIX: dict[str, bytes] = {}
MAX_HEADER_BYTES = 0xFFFF
# From this size on an envelope is spared the copies nothing needs: it is never put in a batch
# (a batch copies it at each end), the broker renames it in one copy, its body is decoded in place.
# A reply of ten 16 KiB attributes was copied seven times between actor and client, most of the
# broker's and half the actor's CPU in that read; for small envelopes the plain way is cheaper.
LARGE_ENVELOPE_BYTES = 64 * 1024


def name_prefix(name: str | bytes) -> bytes:
    """PROTO plus the length-prefixed name: the routing part of an envelope."""
    cached = _NAME_PREFIX.get(name)  # type: ignore[arg-type]
    if cached is None:
        raw = name if isinstance(name, bytes) else name.encode()
        if not 0 < len(raw) <= MAX_NAME_BYTES:
            raise ProtocolError(f"name must be 1..{MAX_NAME_BYTES} bytes: {raw[:80]!r}")
        cached = PROTO + bytes([len(raw)]) + raw
        if len(_NAME_PREFIX) < 10_000:
            _NAME_PREFIX[name] = cached  # type: ignore[index]
    return cached


def encode(dest: str | bytes, kind: Kind, body: dict[str, Any], *, id: int = 0, reply_to: int = 0,
           session: str = "", turn: str = "", sent_at: float | None = None) -> bytes:
    """The envelope a peer sends to the broker."""
    header = _packb([id, time.time() if sent_at is None else sent_at, reply_to, session, turn])
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError("header too large (session or turn id too long)")
    return b"".join((name_prefix(dest), _KIND_PREFIX[kind], _U16.pack(len(header)), header, _packb(body)))


def split_name(envelope: bytes) -> tuple[bytes, int]:
    """(name, offset of the kind) for routing; raises ProtocolError on a malformed prefix."""
    if envelope[:5] != PROTO:
        check_proto(envelope[:5])
    if len(envelope) < 7:
        raise ProtocolError("envelope too short")
    end = 6 + envelope[5]
    if envelope[5] == 0 or len(envelope) < end + 4:
        raise ProtocolError("envelope truncated in its name")
    return envelope[6:end], end


def split_rest(envelope: bytes, offset: int, view: bool = False) -> tuple[bytes, bytes, bytes | memoryview]:
    """(kind, header, body) bytes from the kind's offset, without decoding any of them; `view`:
    the body as a view into the envelope rather than a copy of it (for a big one about to be
    decoded and dropped)."""
    kind_end = offset + 1 + envelope[offset]
    if len(envelope) < kind_end + 2:
        raise ProtocolError("envelope truncated in its kind")
    kind = envelope[offset + 1:kind_end]
    header_end = kind_end + 2 + _U16.unpack_from(envelope, kind_end)[0]
    if len(envelope) < header_end:
        raise ProtocolError("envelope truncated in its header")
    body = memoryview(envelope)[header_end:] if view else envelope[header_end:]
    return kind, envelope[kind_end + 2:header_end], body


def check_proto(prefix: bytes) -> None:
    if prefix != PROTO:
        if prefix.startswith(PROTO_FAMILY):
            raise ProtocolError(f"unsupported protocol version {prefix!r} (this peer speaks {PROTO!r})")
        raise ProtocolError("not an Agent OS bus message")


def decode_header(raw: bytes) -> tuple[int, float, int, str, str]:
    return _header_items(raw)[:5]  # type: ignore[return-value]


def _header_items(raw: bytes) -> list:
    """The header's items, the first five checked; a sixth, if there, is where the body was
    spilled (broker/spill.py)."""
    try:
        header = msgpack.unpackb(raw, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not msgpack: {exc}") from None
    if not isinstance(header, list) or len(header) < 5:
        raise ProtocolError("header must be an array of at least 5 items")
    id, sent_at, reply_to, session, turn = header[:5]
    if not (isinstance(id, int) and isinstance(sent_at, _NUM) and isinstance(reply_to, int)
            and isinstance(session, str) and isinstance(turn, str)):
        raise ProtocolError("header fields have the wrong types")
    header[1] = float(sent_at)
    return header


def decode_kind(raw: bytes) -> Kind:
    kind = _KIND_BY_BYTES.get(raw)
    if kind is None:
        raise ProtocolError(f"unknown message kind {raw[:MAX_NAME_BYTES]!r}")
    return kind


def decode_body(kind: Kind, raw: bytes) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(raw, use_list=True, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"{kind}: body is not msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind}: body must be a map")
    spec = SPECS[kind]
    for name, types in spec.required.items():
        value = body.get(name)
        if value is None or not isinstance(value, types) or (isinstance(value, bool) and types is int):
            raise ProtocolError(f"{kind}: field {name!r} missing or not {_type_name(types)}")
    for name, types in spec.optional.items():
        value = body.get(name)
        if value is not None and not isinstance(value, types):
            raise ProtocolError(f"{kind}: field {name!r} is not {_type_name(types)}")
    return body


def _type_name(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__


def decode(envelope: bytes, src: str | None = None, spill: "SpillReader | None" = None) -> Message:
    """A message as delivered by the broker, whose name field is the sender (or `src`, for an
    envelope taken out of a batch, whose own name field still says where it was going);
    `spill` reads a body its sender spilled into shared memory."""
    name, offset = split_name(envelope)
    kind_raw, header, body = split_rest(envelope, offset, view=len(envelope) >= LARGE_ENVELOPE_BYTES)
    kind = decode_kind(kind_raw)
    if kind is Kind.BATCH:
        raise ProtocolError("a batch inside a batch")
    items = _header_items(header)
    if src is None:
        try:
            src = name.decode()
        except UnicodeDecodeError:
            raise ProtocolError("source name is not UTF-8") from None
    ref = items[5] if len(items) > 5 else None
    if ref is None:
        decoded = decode_body(kind, body)
    elif kind is Kind.UNDELIVERABLE:
        # the broker bounced our own message with its header: the body is the broker's, and the
        # region the header names is in our own ring, free again
        decoded = decode_body(kind, body)
        if spill is not None:
            try:
                spill.read(ref, _ignore)
            except ProtocolError:
                pass
    elif spill is None:
        raise ProtocolError(f"{kind}: its body is in shared memory, which this receiver does not read")
    else:
        decoded = spill.read(ref, lambda view: decode_body(kind, view))
    return Message(src, kind, items[0], items[1], items[2], items[3], items[4], decoded)


def _ignore(view: memoryview) -> None:
    return None


def body_offset(envelope: bytes) -> int:
    """Where the body of a well-formed envelope (one this process encoded) starts."""
    offset = 6 + envelope[5]
    header_at = offset + 1 + envelope[offset]
    return header_at + 2 + _U16.unpack_from(envelope, header_at)[0]


def spilled(envelope: bytes, ref: list) -> bytes:
    """`envelope` without its body, its header naming where the body went instead."""
    offset = 6 + envelope[5]
    header_at = offset + 1 + envelope[offset]
    header = msgpack.unpackb(envelope[header_at + 2:header_at + 2 + _U16.unpack_from(envelope, header_at)[0]])
    header[5:] = [ref]
    packed = _packb(header)
    return b"".join((envelope[:header_at], _U16.pack(len(packed)), packed))


# A batch: envelopes sent to one destination within one event-loop iteration travel as one
# frame. The broker routes it like any message; the receiver takes the envelopes out in order.
_U32 = struct.Struct("<I")
BATCH_BYTES = KIND_BYTES[Kind.BATCH]
MAX_BATCH_BYTES = 1 << 20


def encode_batch(dest: str | bytes, envelopes: list[bytes]) -> bytes:
    header = _packb([0, time.time(), 0, "", ""])
    parts = [name_prefix(dest), _KIND_PREFIX[Kind.BATCH], _U16.pack(len(header)), header]
    for envelope in envelopes:
        parts.append(_U32.pack(len(envelope)))
        parts.append(envelope)
    return b"".join(parts)


def split_batch(body: bytes) -> list[bytes]:
    out = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < 4:
            raise ProtocolError("batch truncated in a length")
        size = _U32.unpack_from(body, pos)[0]
        pos += 4
        if size > end - pos:
            raise ProtocolError("batch truncated in an envelope")
        out.append(body[pos:pos + size])
        pos += size
    return out


# The trace tap: one frame per routed message, `kind NUL msgpack[src, dest, header, broker_time]`,
# so a subscriber filters by kind with a plain ZeroMQ prefix subscription.
def trace_record(kind: bytes, src: bytes, dest: bytes, header: bytes, at: float) -> bytes:
    return kind + b"\x00" + _packb([src, dest, header, at])


def decode_trace_record(record: bytes) -> tuple[str, str, str, tuple[int, float, int, str, str], float]:
    kind, sep, rest = record.partition(b"\x00")
    if not sep:
        raise ProtocolError("trace record without separator")
    try:
        src, dest, header, at = msgpack.unpackb(rest)
    except Exception as exc:
        raise ProtocolError(f"bad trace record: {exc}") from None
    return kind.decode(errors="replace"), src.decode(errors="replace"), dest.decode(errors="replace"), \
        decode_header(header), float(at)
