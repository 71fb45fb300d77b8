"""The fast path's answer to a checkpoint PUT, on a connection with fakes for the gateway around it:
the answer comes from the log's callback, so a failure there must not leave the client waiting."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from agentos.config import Config
from gateway.fast_path import FrontConnection, FrontServer

PUT = b"PUT /v1/sessions/s1/checkpoints/k1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"


class FakeTransport:
    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def writelines(self, parts) -> None:
        for part in parts:
            self.write(part)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connection(answer_body: dict) -> tuple[FrontConnection, FakeTransport, list]:
    """A connection whose log acknowledges every PUT at once with `answer_body`."""
    access: list = []
    history = SimpleNamespace(
        save_checkpoint_then=lambda tenant, sid, raw_sid, key, payload, then: then(answer_body, None))
    gateway = SimpleNamespace(config=Config(), tenant_for=lambda authorization: "default", history=history,
                              access=SimpleNamespace(record=lambda *row: access.append(row)))
    conn = FrontConnection(FrontServer(gateway, lambda: None))
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, access


def test_an_acknowledged_put_is_answered_and_the_next_request_is_read():
    conn, transport, access = connection({"session_id": "s1", "key": "k1", "seq": 1})
    conn.data_received(PUT + PUT)
    assert transport.sent.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert b'"key":"k1"' in transport.sent
    assert [row[2] for row in access] == [200, 200]
    assert not transport.closed


def test_a_failure_while_answering_closes_the_connection_instead_of_leaving_it_waiting(caplog):
    conn, transport, _ = connection({"seq": object()})      # a body orjson cannot encode: a bug of ours
    with caplog.at_level(logging.ERROR, logger="agent-os.gateway"):
        conn.data_received(PUT + PUT)
    assert transport.closed, "the client would wait for an answer that never comes"
    assert b"200" not in transport.sent
    assert "answering PUT s1/k1 failed; closing its connection" in caplog.text
    assert conn.request is None
