"""`agent-os bench soak --minutes 30`: sessions created and abandoned for a long time, and each
process's private memory compared with where it was after warm-up.

Every client opens a new session for each turn and never comes back to it; about half the clients
walk away mid-stream (the connection closes after a few events), the rest read to the end. What
must free the memory: session TTL eviction in the actors, SSE subscriber clean-up in the gateway,
finished-turn retention, flows and permits in the scheduler.

Memory is read from /proc/PID/smaps_rollup every `--sample-secs`. The baseline of each process is
the median of its samples over the last `--window-minutes` of warm-up; the end is the median over
the last `--window-minutes` of the run (same load, same steady state). The window is one whole
period of the store's DuckDB reopen cycle (`storage.duckdb_recycle_secs`), so both windows see
the same sawtooth. Then the load stops and, after one session TTL
and a little more, the idle tree is sampled once more. Exit status 1 if any process ends more than
10% above its baseline, if any process restarted, or if the server exited (the soak ends
there, with no verdict).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.results import ResultsDir, markdown_table, pyplot
from bench.sampling import memory_by_process
from bench.server_proc import ServerProcess
from bench.sse_client import TurnOutcome, read_events

LIMIT = 1.10


async def client(http, base: str, index: int, rng: random.Random, stop: asyncio.Event, counts: collections.Counter,
                 abandon: float, pause: float) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        session = f"soak-{index}-{n}"
        walk_away = rng.random() < abandon
        out = TurnOutcome(session)
        try:
            async with http.post(f"{base}/v1/sessions/{session}/turns", json={"input": f"hello {n}"},
                                 timeout=aiohttp.ClientTimeout(total=60)) as resp:
                if resp.status != 200:
                    counts[f"http_{resp.status}"] += 1
                    await resp.read()
                else:
                    ended = await read_events(resp, out, stop_after=rng.randint(1, 4) if walk_away else None)
                    counts[ended or "abandoned"] += 1
                    # leaving the `async with` early closes the connection: the server sees a disconnect
        except (aiohttp.ClientError, asyncio.TimeoutError):
            counts["error"] += 1
        await asyncio.sleep(pause)


def scrape_gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def sampler(server: ServerProcess, http, every: float, stop: asyncio.Event, t0: float,
                  counts: collections.Counter, rows: list[dict]) -> None:
    """Samples until `stop`; returns early if the server's supervisor has exited (the soak is over)."""
    while server.proc.poll() is None:
        try:
            async with http.get(f"{server.url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                sessions = scrape_gauge(await resp.text(), "agentos_active_sessions")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            sessions = None
        try:
            memory = await asyncio.get_running_loop().run_in_executor(None, memory_by_process, server)
        except OSError:       # its process table went with it: no row, and the loop's test says why
            memory = None
        if memory is not None:
            rows.append({"t": round(time.monotonic() - t0, 1), "turns": sum(counts.values()), "sessions": sessions,
                         "memory": memory})
            print(f"  {rows[-1]['t']:7.0f}s  turns {rows[-1]['turns']:>8}  resident sessions {sessions}  "
                  f"private MiB {sum(m['private_kib'] for m in memory.values()) / 1024:.1f}", file=sys.stderr)
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except asyncio.TimeoutError:
            pass


async def soak(server: ServerProcess, args) -> tuple[list[dict], collections.Counter, dict]:
    stop_load, stop_sampling = asyncio.Event(), asyncio.Event()
    counts: collections.Counter = collections.Counter()
    rows: list[dict] = []
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        sampling = asyncio.ensure_future(sampler(server, http, args.sample_secs, stop_sampling, t0, counts, rows))
        clients = [asyncio.ensure_future(client(http, server.url, i, random.Random(rng.random()), stop_load, counts,
                                                args.abandon, args.pause))
                   for i in range(args.clients)]
        # a server that died ends the soak there, not after half an hour of refused connections
        await asyncio.wait([sampling], timeout=(args.warmup_minutes + args.minutes) * 60)
        stop_load.set()
        await asyncio.gather(*clients)
        load_end = time.monotonic() - t0
        if not sampling.done():
            await asyncio.wait([sampling], timeout=args.idle_secs)
        stop_sampling.set()
        await sampling
        if server.proc.poll() is not None:
            return rows, counts, {"load_end": load_end, "exited": server.proc.returncode}
        idle = {"t": round(time.monotonic() - t0, 1), "memory": memory_by_process(server)}
    return rows, counts, {"load_end": load_end, "idle": idle}


def window_median(rows: list[dict], start: float, end: float) -> dict[str, int]:
    """Each process's median private KiB over the samples taken in [start, end)."""
    values: dict[str, list[int]] = collections.defaultdict(list)
    for row in rows:
        if start <= row["t"] < end:
            for name, m in row["memory"].items():
                values[name].append(m["private_kib"])
    return {name: int(statistics.median(v)) for name, v in values.items()}


def verdict(rows: list[dict], phases: dict, args, restarts: dict[str, int]) -> dict[str, Any]:
    warm, window = args.warmup_minutes * 60, args.window_minutes * 60
    baseline = window_median(rows, warm - window, warm)
    end = window_median(rows, phases["load_end"] - window, phases["load_end"])
    idle = {name: m["private_kib"] for name, m in phases["idle"]["memory"].items()}
    per_process = {name: {"baseline_kib": baseline[name], "end_kib": end.get(name), "idle_kib": idle.get(name),
                          "ratio": round(end[name] / baseline[name], 3) if end.get(name) else None,
                          "restarts": restarts.get(name, 0)}
                   for name in sorted(baseline)}
    ok = all(p["ratio"] is not None and p["ratio"] <= LIMIT and p["restarts"] == 0 for p in per_process.values())
    return {"within_10_percent": ok, "processes": per_process}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent-os bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="measured run after warm-up")
    p.add_argument("--warmup-minutes", type=float, default=10.0)
    p.add_argument("--window-minutes", type=float, default=5.0, help="baseline and end are medians over this long")
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--abandon", type=float, default=0.5, help="share of turns whose client walks away mid-stream")
    p.add_argument("--pause", type=float, default=0.1, help="each client's think time between turns")
    p.add_argument("--ttl", type=float, default=60.0, help="kernel.session_ttl_secs of the server under test")
    p.add_argument("--sample-secs", type=float, default=10.0)
    p.add_argument("--idle-secs", type=float, default=None, help="after the load: default TTL + 45 s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", default="soak")
    p.add_argument("--results-root", default=None)
    args = p.parse_args(argv)
    if args.idle_secs is None:
        args.idle_secs = args.ttl + 45
    return args


def server_config(args) -> dict[str, Any]:
    return {"kernel": {"actors": 2, "max_in_flight_turns": 0, "session_ttl_secs": args.ttl},
            "storage": {"durability": "local", "duckdb_recycle_secs": args.window_minutes * 60},
            "mock": {"ttft_ms": 100, "tokens": 40, "tps": 200}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = ResultsDir(args.name, Path(args.results_root) if args.results_root else None)
    results.write_config({"command": "bench soak", "args": vars(args), "server": server_config(args)})
    server = ServerProcess.temporary("bench-soak-", server_config(args)).start()
    try:
        print(f"soak: {args.warmup_minutes} min warm-up + {args.minutes} min, {args.clients} clients, "
              f"TTL {args.ttl:g}s on {server.url}", file=sys.stderr)
        rows, counts, phases = asyncio.run(soak(server, args))
        if "exited" in phases:
            print(f"soak: the server exited with {phases['exited']} after {phases['load_end']:.0f} s "
                  f"({sum(counts.values())} turns):\n{server.log_tail()}", file=sys.stderr)
            results.write_rows(rows)
            results.write_summary(f"# Memory soak: the server exited with {phases['exited']} after "
                                  f"{phases['load_end']:.0f} s; no verdict\n")
            return 1
        restarts = {r["name"]: r["restarts"] for r in server.table()["children"]}
    finally:
        server.stop()
    result = verdict(rows, phases, args, restarts)
    result.update(turns=dict(counts), load_end_secs=phases["load_end"])
    results.write_rows(rows)
    results.write_rows([result], "verdict.jsonl")
    write_report(results, rows, result, phases, args)
    print((results.path / "summary.md").read_text())
    return 0 if result["within_10_percent"] else 1


def write_report(results: ResultsDir, rows: list[dict], result: dict, phases: dict, args) -> None:
    total = sum(result["turns"].values())
    lines = [
        f"# Memory soak: {args.warmup_minutes:g} min warm-up + {args.minutes:g} min of sessions created and "
        "abandoned", "",
        f"{args.clients} clients, a new session per turn, never revisited; {args.abandon:.0%} walk away after 1-4 "
        f"events. Session TTL {args.ttl:g} s. {total} turns: {dict(sorted(result['turns'].items()))}.", "",
        f"**Every process within 10% of its post-warm-up private memory: "
        f"{'yes' if result['within_10_percent'] else 'NO'}**", "",
        f"Baseline: median private memory over the last {args.window_minutes:g} min of warm-up. End: median over "
        f"the last {args.window_minutes:g} min of load. Idle: {args.idle_secs:g} s after the load stopped (one TTL "
        "and more).", "",
        markdown_table(["process", "baseline KiB", "end KiB", "end / baseline", "idle KiB", "restarts"],
                       [(name, p["baseline_kib"], p["end_kib"], p["ratio"], p["idle_kib"], p["restarts"])
                        for name, p in result["processes"].items()]),
    ]
    results.write_summary("\n".join(lines))
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ts = [r["t"] / 60 for r in rows]
    for name in result["processes"]:
        top.plot(ts, [r["memory"].get(name, {}).get("private_kib", 0) / 1024 for r in rows], label=name)
    top.axvline(args.warmup_minutes, color="gray", linestyle="--", linewidth=0.8)
    top.axvline(phases["load_end"] / 60, color="gray", linestyle=":", linewidth=0.8)
    top.set_ylabel("private MiB")
    top.legend(fontsize=7, ncol=3)
    top.set_title("Private memory per process (dashed: end of warm-up; dotted: load stops)")
    bottom.plot(ts, [r["sessions"] or 0 for r in rows], color="black")
    bottom.set_ylabel("resident sessions")
    bottom.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(results.figure_path("soak.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
