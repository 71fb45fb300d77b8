"""Mid-sized replies over the real bus, through the ring or whole through the broker.

A broker process, a replying process (actor/0) and this process (gateway/0) sending requests
with 8 in flight; each reply carries SIZE bytes. The ring's threshold is set in every process
before it starts (codec.LARGE_ENVELOPE_BYTES): 1 KiB puts every reply through the ring, 1 GiB
none. Prints replies/s and CPU per reply of each process (from /proc/<pid>/stat).
usage: mid_bodies.py SIZE THRESHOLD SECONDS
"""
import asyncio
import os
import sys
import tempfile
import time

SIZE, THRESHOLD, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
from agentos import native_memory  # noqa: E402
native_memory.limit_arenas()   # the tree's malloc settings (agentos/forkserver.py), inherited by the forks
from broker import codec  # noqa: E402
codec.LARGE_ENVELOPE_BYTES = THRESHOLD
from broker.client import Bus  # noqa: E402
from broker.protocol import Kind  # noqa: E402
from broker.server import Broker  # noqa: E402


def cpu_secs(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_broker(endpoint: str, tap: str) -> None:
    import zmq
    b = Broker(endpoint, tap, peer_timeout_secs=5.0, context=zmq.Context())
    b.run(lambda: False)


def run_replier(endpoint: str) -> None:
    payload = "r" * SIZE

    async def main():
        def on_stats(msg):
            bus.reply(msg, Kind.STATS_REPLY, {"role": "x", "stats": {"p": payload}})
        bus = Bus("actor/0", endpoint, {Kind.STATS: on_stats})
        await bus.start()
        await asyncio.sleep(SECS + 30)
    asyncio.run(main())


def main() -> None:
    work = tempfile.mkdtemp(prefix="mid")
    endpoint, tap = f"ipc://{work}/b.sock", f"ipc://{work}/t.sock"
    pids = []
    for target, args in ((run_broker, (endpoint, tap)), (run_replier, (endpoint,))):
        pid = os.fork()
        if pid == 0:
            try:
                target(*args)
            finally:
                os._exit(0)
        pids.append(pid)
        time.sleep(0.3)

    async def client():
        bus = Bus("gateway/0", endpoint)
        await bus.start()
        while "actor/0" not in (await bus.request("broker", Kind.PEERS, {}, timeout=5)).body["peers"]:
            await asyncio.sleep(0.05)
        count = 0
        stop_at = [0.0]

        async def loop():
            nonlocal count
            while time.monotonic() < stop_at[0]:
                reply = await bus.request("actor/0", Kind.STATS, {}, timeout=5)
                assert len(reply.body["stats"]["p"]) == SIZE
                count += 1
        stop_at[0] = time.monotonic() + 1.0      # warm-up
        await asyncio.gather(*(loop() for _ in range(8)))
        count = 0
        before = {p: cpu_secs(p) for p in pids + [os.getpid()]}
        t0 = time.monotonic()
        stop_at[0] = t0 + SECS
        await asyncio.gather(*(loop() for _ in range(8)))
        elapsed = time.monotonic() - t0
        after = {p: cpu_secs(p) for p in pids + [os.getpid()]}
        stats = bus.stats()
        await bus.close()
        return count, elapsed, {p: after[p] - before[p] for p in after}, stats

    count, elapsed, cpu, stats = asyncio.run(client())
    for pid in pids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    from broker import spill
    spill.remove_leftovers(endpoint, True)
    names = dict(zip(pids + [os.getpid()], ("broker", "replier", "client")))
    per = {names[p]: round(c / count * 1e6, 1) for p, c in cpu.items()}
    print(f"size={SIZE} threshold={THRESHOLD} replies/s={count / elapsed:.0f} "
          f"cpu_us_per_reply={per} total={sum(per.values()):.1f}")


main()
