"""The fast path's PUT: answered from the append's callback, in order, with the log's errors mapped."""
from __future__ import annotations

import asyncio
import types

from agentos.config import from_dict
from gateway.access import AccessLog
from gateway.fast_path import FrontConnection, FrontServer
from gateway.history import HistoryRoutes
from gateway.latest_checkpoints import Checkpoint, LatestCheckpoints
from gateway.tenancy import DEFAULT_TENANT
from storage.log_client import LogWriteError


class _Transport:
    def __init__(self):
        self.out = []

    def write(self, data):
        self.out.append(bytes(data))

    def writelines(self, parts):
        self.out.append(b"".join(parts))

    def is_closing(self):
        return False


class _History:
    """HistoryRoutes' callback half, with appends the test resolves by hand."""

    def __init__(self):
        self.latest = LatestCheckpoints(max_bytes=1 << 20)
        self.appends: list[tuple[asyncio.Future, str, bytes]] = []
        self.gw = types.SimpleNamespace(config=from_dict({}))

    def start_checkpoint(self, tenant, sid, key, payload):
        fut = asyncio.get_running_loop().create_future()
        self.appends.append((fut, key, payload))
        return fut, len(self.appends)

    checkpoint_saved = HistoryRoutes.checkpoint_saved


def _put(key: str, payload: bytes) -> bytes:
    return (f"PUT /v1/sessions/s1/checkpoints/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode() + payload


def test_puts_in_one_read_are_answered_in_order_once_durable_and_a_write_error_is_a_507():
    async def go():
        history = _History()
        gateway = types.SimpleNamespace(config=from_dict({}), tenant_for=lambda auth: DEFAULT_TENANT,
                                        access=AccessLog(None), history=history)
        conn = FrontConnection(FrontServer(gateway, None))
        transport = _Transport()
        conn.connection_made(transport)
        get = b"GET /v1/sessions/s1/checkpoints/latest HTTP/1.1\r\nHost: x\r\n\r\n"
        conn.data_received(_put("a", b"one") + _put("b", b"two" * 1000) + get[:20])
        assert [key for _, key, _ in history.appends] == ["a"]      # one request at a time
        history.appends[0][0].set_result(100)
        await asyncio.sleep(0)
        assert transport.out[0].startswith(b"HTTP/1.1 200") and b'"key":"a"' in transport.out[0]
        assert [key for _, key, _ in history.appends] == ["a", "b"] and history.appends[1][2] == b"two" * 1000
        conn.data_received(get[20:])                 # arrives while b is in flight: kept for later
        assert len(transport.out) == 1
        history.appends[1][0].set_exception(LogWriteError("disk_full", "no space left"))
        await asyncio.sleep(0)
        assert transport.out[1].startswith(b"HTTP/1.1 507") and b"insufficient_storage" in transport.out[1]
        # the GET behind it was answered at once, from what is held: still "a", since "b" failed
        head, _, body = transport.out[2].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"X-Checkpoint-Key: a" in head and body == b"one"
        assert conn.request is None and not conn.buf
        assert history.latest.get("s1") == Checkpoint("a", 1, b"one")
    asyncio.run(go())
