"""The broker after a stall of its own (stopped, starved): its peers' silence meanwhile says
nothing. The broker runs on a thread of the test's process, its clock moved on by the test."""
import asyncio
import threading
import time
from types import SimpleNamespace

import zmq

from broker import server as server_module
from broker.client import Bus
from broker.protocol import Kind
from broker.server import Broker
from test_bus import registered, run


def test_a_broker_that_did_not_run_for_a_while_takes_no_peer_for_dead(tmp_path, monkeypatch):
    """Peers' messages wait unread while the broker is stopped: their silence then says nothing.
    The broker took each for dead until it read its next heartbeat, and bounced what was sent to
    it meanwhile (a notice so bounced is lost)."""
    ahead = [0.0]
    monkeypatch.setattr(server_module, "time", SimpleNamespace(
        monotonic=lambda: time.monotonic() + ahead[0], time=time.time))
    ctx = zmq.Context()
    b = Broker(f"ipc://{tmp_path}/b.sock", f"ipc://{tmp_path}/t.sock", peer_timeout_secs=3.0, context=ctx)
    stop = threading.Event()
    thread = threading.Thread(target=b.run, args=(stop.is_set,), daemon=True)
    thread.start()

    async def go():
        got = []
        worker = Bus("worker/w1", f"ipc://{tmp_path}/b.sock", heartbeat_secs=30.0)
        actor = Bus("actor/0", f"ipc://{tmp_path}/b.sock", {Kind.WORKER_ALIVE: got.append}, heartbeat_secs=30.0)
        await worker.start()
        await actor.start()
        await registered(b, b"actor/0")
        await registered(b, b"worker/w1")
        ahead[0] = 10.0               # the broker's clock moves on as if it had been stopped 10 s
        await asyncio.sleep(0.5)      # it wakes from its poll and sees the gap
        worker.send("actor/0", Kind.WORKER_ALIVE, {"runs": [], "tasks": []})
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.02)
        await worker.close()
        await actor.close()
        return got

    try:
        got = run(go())
    finally:
        stop.set()
        thread.join(5)
        b.close()
        ctx.term()
    assert len(got) == 1 and b.undeliverable == {}
