"""Tests for the HTTP/1.1 wire decoders of actors/http_wire.py: the SSE parser and the chunked
body decoder, each fed whole, byte by byte and at random split points."""
from __future__ import annotations

import random

import pytest

from actors.http_wire import ChunkedDecoder, HttpProtocolError, SSEParser


def splits(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, min(12, len(data) - 1))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


# ------------------------------------------------------------------------------------ SSE parser
SSE_STREAM = (
    b": keep-alive\n\n"
    b"id: 1\nevent: turn.started\ndata: {\"turn_id\": \"t1\", \"session_id\": \"s\"}\n\n"
    b"id: 2\r\nevent: delta\r\ndata: {\"text\": \" lorem\"}\r\n\r\n"
    b": comment between events\n"
    b"id: 3\revent: delta\rdata:{\"text\": \"no space\"}\r\r"
    b"event: delta\ndata: line one\ndata: line two\nretry: 10\nunknown: x\n\n"
    b"\n\n"  # blank lines alone dispatch nothing
    b"data: plain message\n\n"
    b"id: 9\nevent: turn.completed\ndata: {\"usage\": {}, \"durations\": {}}\n\n"
    b"event: turn.cancelled\n\n"
    b"data: incomplete tail with no blank line"
)
SSE_EXPECTED = [
    (b"turn.started", b'{"turn_id": "t1", "session_id": "s"}', b"1"),
    (b"delta", b'{"text": " lorem"}', b"2"),
    (b"delta", b'{"text": "no space"}', b"3"),
    (b"delta", b"line one\nline two", b"3"),
    (b"message", b"plain message", b"3"),
    (b"turn.completed", b'{"usage": {}, "durations": {}}', b"9"),
    (b"turn.cancelled", b"", b"9"),
]


def parse_all(pieces: list[bytes]) -> tuple[list[tuple], int]:
    parser = SSEParser()
    events = [tuple(e) for piece in pieces for e in parser.feed(piece)]
    return events, parser.comments


def test_sse_parser_whole_stream():
    assert parse_all([SSE_STREAM]) == (SSE_EXPECTED, 2)


def test_sse_parser_byte_by_byte():
    assert parse_all([SSE_STREAM[i:i + 1] for i in range(len(SSE_STREAM))]) == (SSE_EXPECTED, 2)


def test_sse_parser_random_splits():
    rng = random.Random(7)
    for _ in range(300):
        assert parse_all(splits(SSE_STREAM, rng)) == (SSE_EXPECTED, 2)


def test_sse_parser_rejects_unbounded_event():
    parser = SSEParser(max_event_bytes=100)
    with pytest.raises(HttpProtocolError):
        parser.feed(b"data: " + b"x" * 200)


# ------------------------------------------------------------------------------- chunked decoder
def chunk_encode(body: bytes, rng: random.Random) -> bytes:
    out, pos = [], 0
    while pos < len(body):
        size = rng.randint(1, 40)
        ext = b";name=value" if rng.random() < 0.2 else b""
        out.append(b"%x%s\r\n%s\r\n" % (size if pos + size <= len(body) else len(body) - pos,
                                        ext, body[pos:pos + size]))
        pos += size
    return b"".join(out) + b"0\r\nX-Trailer: yes\r\n\r\n"


def decode_all(pieces: list[bytes]) -> tuple[bytes, bytes]:
    decoder = ChunkedDecoder()
    body = b"".join(part for piece in pieces for part in decoder.feed(piece))
    assert decoder.done
    return body, decoder.tail


def test_chunked_decoder_whole_bytewise_and_random_splits():
    rng = random.Random(11)
    body = SSE_STREAM * 3
    wire = chunk_encode(body, rng) + b"NEXT"
    assert decode_all([wire]) == (body, b"NEXT")
    assert decode_all([wire[i:i + 1] for i in range(len(wire))]) == (body, b"NEXT")
    for _ in range(300):
        assert decode_all(splits(wire, rng)) == (body, b"NEXT")


def test_chunked_decoder_then_sse_gives_identical_events():
    rng = random.Random(3)
    wire = chunk_encode(SSE_STREAM, rng)
    for _ in range(100):
        decoder, parser, events = ChunkedDecoder(), SSEParser(), []
        for piece in splits(wire, rng):
            for part in decoder.feed(piece):
                events.extend(tuple(e) for e in parser.feed(part))
        assert (events, parser.comments) == (SSE_EXPECTED, 2)


@pytest.mark.parametrize("wire", [b"0x5\r\nhello\r\n", b"+5\r\nhello\r\n", b"zz\r\n",
                                  b"5\r\nhelloXX", b"5\r\nhello\rX"])
def test_chunked_decoder_rejects_malformed(wire):
    decoder = ChunkedDecoder()
    with pytest.raises(HttpProtocolError):
        for i in range(len(wire)):
            decoder.feed(wire[i:i + 1])
