"""Replies of a given size over the real bus, through the sender's ring or whole through the broker.

    python -m bench.bus_bodies --sizes 8k,16k,32k,64k --rounds 3 --secs 3 --name bus-bodies

Each trial starts its own broker (broker/server.py), a replier (a Bus answering every request
with a body of SIZE bytes) and a client sending requests with `--in-flight` outstanding, each a
process of its own with the tree's malloc settings (agentos/native_memory.py). Arm `ring` sends
every reply from 1 KiB on through the replier's ring in /dev/shm (broker/spill.py, whatever
SPILL_MIN_BYTES says), arm `broker` turns the ring off. It reports replies/s and the CPU each
process spent per reply (/proc/<pid>/stat): the question the ring's threshold answers is where
the ring starts to pay. Arms alternate within a round, sizes in order.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import cpu_speed
from bench.results import ResultsDir, markdown_table, pyplot

ARMS = ("ring", "broker")
PROCESSES = ("broker", "replier", "client")


def parse_size(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def _cpu_secs(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one trial, in a process of its own (`--trial`): its forks inherit its malloc settings ------------

def _serve_broker(endpoint: str, tap: str) -> None:
    import zmq

    from broker.server import Broker
    Broker(endpoint, tap, peer_timeout_secs=10.0, context=zmq.Context()).run(lambda: False)


def _serve_replies(endpoint: str, size: int, spill_bytes: int) -> None:
    from broker.client import Bus
    from broker.protocol import Kind
    payload = "r" * size

    async def main() -> None:
        bus = Bus("actor/0", endpoint, spill_bytes=spill_bytes)
        bus.on(Kind.STATS, lambda msg: bus.reply(msg, Kind.STATS_REPLY, {"role": "x", "stats": {"p": payload}}))
        await bus.start()
        await asyncio.Event().wait()
    asyncio.run(main())


async def _client(endpoint: str, size: int, secs: float, in_flight: int, pids: dict[str, int]) -> dict:
    from broker.client import Bus
    from broker.protocol import Kind
    bus = Bus("gateway/0", endpoint)
    await bus.start()
    for _ in range(200):
        if "actor/0" in (await bus.request("broker", Kind.PEERS, {}, timeout=5)).body["peers"]:
            break
        await asyncio.sleep(0.05)
    count = 0
    until = 0.0

    async def loop() -> None:
        nonlocal count
        while time.monotonic() < until:
            reply = await bus.request("actor/0", Kind.STATS, {}, timeout=10)
            if len(reply.body["stats"]["p"]) != size:
                raise AssertionError("a reply came back cut")
            count += 1

    until = time.monotonic() + 1.0          # warm-up: the ring mapped, malloc's heaps grown
    await asyncio.gather(*(loop() for _ in range(in_flight)))
    count = 0
    before = {name: _cpu_secs(pid) for name, pid in pids.items()}
    started = time.monotonic()
    until = started + secs
    await asyncio.gather(*(loop() for _ in range(in_flight)))
    elapsed = time.monotonic() - started
    cpu = {name: _cpu_secs(pid) - before[name] for name, pid in pids.items()}
    stats = bus.stats()
    await bus.close()
    return {"replies_per_sec": count / elapsed, "replies": count,
            "cpu_us_per_reply": {name: cpu[name] / count * 1e6 for name in cpu}, "client_bus": stats}


def trial(size: int, arm: str, secs: float, in_flight: int) -> dict:
    from agentos import native_memory
    native_memory.limit_arenas()
    from broker import spill
    spill.SPILL_MIN_BYTES = 1024            # arm "ring": every reply in this bench's sizes
    work = tempfile.mkdtemp(prefix="bus-bodies-")
    endpoint, tap = f"ipc://{work}/b.sock", f"ipc://{work}/t.sock"
    children: dict[str, int] = {}
    try:
        for name, target, args in (("broker", _serve_broker, (endpoint, tap)),
                                   ("replier", _serve_replies, (endpoint, size, spill.RING_BYTES if arm == "ring" else 0))):
            pid = os.fork()
            if pid == 0:
                try:
                    target(*args)
                finally:
                    os._exit(0)
            children[name] = pid
            time.sleep(0.2)
        row = asyncio.run(_client(endpoint, size, secs, in_flight, {**children, "client": os.getpid()}))
    finally:
        for pid in children.values():
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        spill.remove_leftovers(endpoint, True)
        shutil.rmtree(work, ignore_errors=True)
    return {"size": size, "arm": arm, "ring_dir": spill.spill_dir(endpoint), **row}


# -- the run ------------------------------------------------------------------------------------------

def summary(rows: list[dict], sizes: list[int]) -> str:
    table = []
    for size in sizes:
        med = {arm: [r for r in rows if r["size"] == size and r["arm"] == arm] for arm in ARMS}
        if not all(med.values()):
            continue
        rate = {arm: statistics.median(r["replies_per_sec"] for r in med[arm]) for arm in ARMS}
        cpu = {arm: {p: statistics.median(r["cpu_us_per_reply"][p] for r in med[arm]) for p in PROCESSES} for arm in ARMS}
        total = {arm: sum(cpu[arm].values()) for arm in ARMS}
        table.append([f"{size // 1024} KiB" if size % 1024 == 0 else size,
                      " / ".join(f"{r['replies_per_sec']:,.0f}" for r in med["ring"]),
                      " / ".join(f"{r['replies_per_sec']:,.0f}" for r in med["broker"]),
                      f"{rate['ring'] / rate['broker']:.2f}×",
                      " + ".join(f"{cpu['ring'][p]:.0f}" for p in PROCESSES) + f" = {total['ring']:.0f}",
                      " + ".join(f"{cpu['broker'][p]:.0f}" for p in PROCESSES) + f" = {total['broker']:.0f}",
                      f"{total['ring'] / total['broker']:.2f}×"])
    return markdown_table(["reply body", "ring replies/s (rounds)", "broker replies/s", "ring / broker (medians)",
                           "ring CPU µs per reply (broker + replier + client)", "broker CPU µs per reply",
                           "CPU ring / broker"], table)


def plot(rows: list[dict], sizes: list[int], path: Path) -> None:
    plt = pyplot()
    fig, (rate_ax, cpu_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in ARMS:
        xs = [s / 1024 for s in sizes]
        mine = [[r for r in rows if r["size"] == s and r["arm"] == arm] for s in sizes]
        rate_ax.plot(xs, [statistics.median(r["replies_per_sec"] for r in rs) for rs in mine], marker="o", label=arm)
        cpu_ax.plot(xs, [statistics.median(sum(r["cpu_us_per_reply"].values()) for r in rs) for rs in mine],
                    marker="o", label=arm)
    for ax, title in ((rate_ax, "replies/s (median of rounds)"), (cpu_ax, "CPU µs per reply, three processes")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("reply body, KiB")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bus_bodies", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8k,16k,32k,64k")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--secs", type=float, default=3.0)
    p.add_argument("--in-flight", type=int, default=8)
    p.add_argument("--name", default="bus-bodies")
    p.add_argument("--results-root", type=Path, default=None)
    p.add_argument("--trial", nargs=2, metavar=("SIZE", "ARM"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trial:
        print(json.dumps(trial(parse_size(args.trial[0]), args.trial[1], args.secs, args.in_flight)))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    out = ResultsDir(args.name, args.results_root)
    cpu = cpu_speed.python_workload()
    out.write_config({"argv": sys.argv[1:] if argv is None else argv, "sizes": sizes, "rounds": args.rounds,
                      "secs": args.secs, "in_flight": args.in_flight, "cpu_speed": cpu})
    rows = []
    for round_ in range(1, args.rounds + 1):
        for size in sizes:
            for arm in ARMS if round_ % 2 else ARMS[::-1]:
                done = subprocess.run([sys.executable, "-m", "bench.bus_bodies", "--trial", str(size), arm,
                                       "--secs", str(args.secs), "--in-flight", str(args.in_flight)],
                                      capture_output=True, text=True, timeout=args.secs + 60)
                if done.returncode != 0:
                    raise SystemExit(f"trial {size} {arm} failed:\n{done.stderr}")
                row = {"round": round_, **json.loads(done.stdout.strip().splitlines()[-1])}
                rows.append(row)
                out.append_row(row)
                print(f"round {round_} {size:>7} B {arm:<6} {row['replies_per_sec']:8,.0f} replies/s, CPU µs per "
                      f"reply {sum(row['cpu_us_per_reply'].values()):.1f}", flush=True)
    text = summary(rows, sizes)
    plot(rows, sizes, out.figure_path("replies.png"))
    out.write_summary(f"# Replies over the bus: the ring or the broker\n\n## Conditions\n\n## Rounds\n\n{text}\n"
                      + "\n".join(cpu_speed.section(cpu)) + "\n")
    print(text)
    print(f"results: {out.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
