"""The gateway's readiness check against a broker on a thread (gateway/peer_watch.py)."""
import asyncio
import sys

from broker.client import Bus
from gateway.peer_watch import PeerWatch


async def checked_until(watch: PeerWatch, missing: list[str]) -> list[str]:
    """What the watch says is missing once it says `missing`, or after 5 s of asking."""
    for _ in range(100):
        await watch.check()
        if watch.missing == missing:
            break
        await asyncio.sleep(0.05)
    return list(watch.missing)


def test_missing_peers_then_ready_and_names_kept_interned(broker):
    _, endpoint = broker

    async def go():
        buses = [Bus("gateway/0", endpoint), Bus("actor/0", endpoint), Bus("writer/log/0", endpoint)]
        gateway, actor, log = buses
        watch = PeerWatch(gateway, ["actor/0", "writer/log/0"])
        try:
            unchecked = list(watch.missing)
            await gateway.start()
            await actor.start()
            half = await checked_until(watch, ["writer/log/0"])
            await log.start()
            ready = await checked_until(watch, [])
            # The next answer's names are the objects the last one interned (and the watch still
            # holds), not new entries in the interpreter's table of interned strings, which never
            # shrinks: a fresh copy interns to that same object.
            held = next(name for name in watch.peers if name == "writer/log/0")
            await watch.check()
            again = next(name for name in watch.peers if name == "writer/log/0")
            return unchecked, half, ready, held, again, sys.intern("".join(["writer/", "log/0"]))
        finally:
            for bus in buses:
                await bus.close()

    unchecked, half, ready, held, again, interned = asyncio.run(asyncio.wait_for(go(), 20))
    assert unchecked == ["(not checked yet)"]
    assert half == ["writer/log/0"]
    assert ready == []
    assert again is held and interned is held


def test_no_broker_is_missing_broker(tmp_path):
    async def go():
        bus = Bus("gateway/0", f"ipc://{tmp_path}/nobody.sock")
        await bus.start()
        try:
            watch = PeerWatch(bus, ["actor/0"])
            await watch.check()
            return watch.missing
        finally:
            await bus.close()

    assert asyncio.run(asyncio.wait_for(go(), 20)) == ["broker"]
