"""`agent-os bench broadcasts`: waking N waiting runs with one publish to the tenant's channel
(`POST /v1/channels/{name}`), side by side with what a client did before it: a publish to each
run's own channel (`POST /v1/runs/{id}/channels/{name}`), 64 at a time.

Owns: a fresh process tree (full persistence) and two workers of bench/steps_app.py. For each N,
each round starts N `listener` runs of a new group (an attribute), waits until all N wait on
`go`, then wakes them one way or the other, in turn (the order swapped each round). Each run's
message carries the time its publishing began; each run returns the seconds from then to the
step it takes once woken.

Reports per N and way: when the publisher had its answer (one broadcast, or the last of the N
publishes), the woken steps' p50 / p99 / last (from the publishing's start), and wakes per
second (N over the last). Every message is durable before its publisher's answer either way.

    agent-os bench broadcasts [--runs 100,1000] [--rounds 3] [--name NAME]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from bench.cpu_speed import python_workload
from bench.results import ResultsDir, markdown_table, pyplot
from bench.server_proc import ServerProcess
from bench.stats import percentile
from bench.step_workers import start_workers, stop_workers

AT_ONCE = 64   # requests in flight: the runs' starts, and the publishes one per run
WAYS = ("broadcast", "per_run")


async def _each(items, fn, at_once: int = AT_ONCE) -> list:
    gate = asyncio.Semaphore(at_once)

    async def one(item):
        async with gate:
            return await fn(item)
    return list(await asyncio.gather(*(one(item) for item in items)))


async def _post(http, url: str, body: dict) -> dict:
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=120)) as resp:
        answer = await resp.json(content_type=None)
        if resp.status not in (200, 201, 202):
            raise RuntimeError(f"POST {url}: {resp.status} {answer}")
        return answer


async def _waiting(http, base: str) -> int:
    async with http.get(f"{base}/v1/channels/go?flow=listener&limit=1") as resp:
        return (await resp.json(content_type=None))["count"]


async def round_of(http, base: str, n: int, way: str, group: str) -> dict:
    runs = await _each(range(n), lambda i: _post(http, f"{base}/v1/flows/listener/runs", {"input": group}))
    ids = [r["run_id"] for r in runs]
    for _ in range(1200):   # (60 s)
        if await _waiting(http, base) >= n:
            break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError(f"{n} runs never all waited on go")
    sent = time.time()
    began = time.perf_counter()
    if way == "broadcast":
        answer = await _post(http, f"{base}/v1/channels/go", {"message": {"sent": sent}, "where": {"group": group}})
        if answer["delivered"] != n:
            raise RuntimeError(f"a broadcast to {n} waiting runs reached {answer['delivered']}")
    else:
        await _each(ids, lambda run_id: _post(http, f"{base}/v1/runs/{run_id}/channels/go",
                                              {"message": {"sent": sent}}))
    answered = time.perf_counter() - began

    async def woke(run_id: str) -> float:
        async with http.get(f"{base}/v1/runs/{run_id}?wait=60", timeout=aiohttp.ClientTimeout(total=90)) as resp:
            run = await resp.json(content_type=None)
        if run.get("status") != "completed":
            raise RuntimeError(f"run {run_id} did not complete: {run}")
        return run["result"]
    wakes = sorted(await _each(ids, woke))
    return {"runs": n, "way": way, "answered_ms": round(answered * 1000, 2),
            "wake_p50_ms": round(percentile(wakes, 50) * 1000, 2),
            "wake_p99_ms": round(percentile(wakes, 99) * 1000, 2),
            "last_wake_ms": round(wakes[-1] * 1000, 2), "wakes_per_sec": round(n / wakes[-1], 1)}


async def measure(base: str, sizes: list[int], rounds: int) -> list[dict]:
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=AT_ONCE * 2)) as http:
        await round_of(http, base, min(50, sizes[0]), "broadcast", "warm-up")
        for n in sizes:
            for r in range(rounds):
                for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                    row = {**await round_of(http, base, n, way, f"g{n}-{r}-{way}"), "round": r + 1}
                    rows.append(row)
                    print(f"  {row}", file=sys.stderr)
    return rows


def medians(rows: list[dict]) -> list[dict]:
    out = []
    for n in sorted({r["runs"] for r in rows}):
        for way in WAYS:
            mine = [r for r in rows if r["runs"] == n and r["way"] == way]
            out.append({"runs": n, "way": way, "rounds": len(mine),
                        **{k: round(statistics.median(r[k] for r in mine), 2)
                           for k in ("answered_ms", "wake_p50_ms", "wake_p99_ms", "last_wake_ms", "wakes_per_sec")}})
    return out


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for way, style in zip(WAYS, ("-", "--")):
        mine = [r for r in medians(rows) if r["way"] == way]
        ax.plot([r["runs"] for r in mine], [r["last_wake_ms"] for r in mine], style, marker="o",
                label=f"{way}: last woken step")
        ax.plot([r["runs"] for r in mine], [r["answered_ms"] for r in mine], style, marker="x",
                label=f"{way}: publisher answered")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("runs waiting")
    ax.set_ylabel("ms from the publishing's start (median of rounds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-os bench broadcasts", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="100,1000", help="counts of waiting runs (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per count and way (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--name", default="broadcasts", help="results folder name (default: %(default)s)")
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.runs.split(",")]
    results = ResultsDir(args.name, args.results_root)
    speed = python_workload()
    results.write_config({"benchmark": "broadcasts", "runs": sizes, "rounds": args.rounds, "workers": args.workers,
                          "slots": args.slots, "at_once": AT_ONCE, "cpu_workload_before": speed})
    server = ServerProcess.temporary("bench-broadcasts-", {"storage": {"durability": "local"}}).start()
    workers = []
    try:
        workers = start_workers(server, args.workers, args.slots)
        rows = asyncio.run(measure(server.url, sizes, args.rounds))
    finally:
        stop_workers(workers)
        server.stop()
    results.write_rows(rows)
    table = medians(rows)
    results.write_rows(table, "medians.jsonl")
    plot(rows, results.figure_path("broadcasts.png"))
    text = markdown_table(["runs", "way", "rounds", "publisher answered ms", "wake p50 ms", "wake p99 ms",
                           "last wake ms", "wakes/s"],
                          [(r["runs"], r["way"], r["rounds"], r["answered_ms"], r["wake_p50_ms"], r["wake_p99_ms"],
                            r["last_wake_ms"], r["wakes_per_sec"]) for r in table])
    results.write_summary(
        "# Waking N waiting runs: one publish to the tenant's channel, or one to each run's\n\n"
        f"Medians of {args.rounds} rounds; wake times from the publishing's start to each woken run's "
        f"next step; per_run: {AT_ONCE} publishes in flight. The CPU workload read {speed['p50_us']} µs "
        "an iteration before.\n\n" + text + "\n")
    print(text)
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
