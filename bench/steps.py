"""`agent-os bench steps`: the durable-step scenarios of the reference table, closed loop.

A fresh process tree (full persistence) and worker processes running `bench/steps_app.py`; a
bus client in this process plays the clients (the operations a Python program would call). Each
scenario: a fixed number of concurrent clients, each sending its next request when the last one
returns; warm-up, then a measured window; three runs, the median reported. Per run: ops/s,
latency p50/p99, CPU of the server tree and of the workers, and fsyncs per second. With
`--peer restate`, the same scenarios run against Restate on the same machine, side by side.

Scenarios: sync_steps and async_steps (flows of 10 sequential steps; steps/s), fanned_steps (flows
of 10 SYNC steps at once, asyncio.gather; steps/s; not in the reference table, so run by name:
`--scenarios sync_steps,fanned_steps`), flows (one-step
flows started and completed), attr_read (one attribute), attr_update (lock-and-update one
attribute), attr_read_10x16k (ten 16 KiB attributes, no worker involved), channel_wake (latency
from publish to the start of the woken step; the run's setup before each publish is not timed).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from actors.flow_client import FlowClient
from bench.cpu_speed import python_workload
from bench.results import ResultsDir
from bench.sampling import cpu_delta, tree_cpu
from bench.server_proc import ServerProcess
from bench.step_workers import start_workers, stop_workers
from bench.stats import percentile
from bench.steps_measure import PUTS, closed_loop, idle_requests, scrape
from broker.client import Bus

SCENARIOS = ["sync_steps", "async_steps", "flows", "attr_read", "attr_update", "attr_read_10x16k", "channel_wake"]
DEFAULT_CLIENTS = {"sync_steps": 128, "async_steps": 64, "flows": 128, "attr_read": 128, "attr_update": 64,
                   "attr_read_10x16k": 32, "channel_wake": 64, "fanned_steps": 128}
STEP_FLOWS = {"sync_steps": "timed_sync_steps", "async_steps": "timed_async_steps",
              "fanned_steps": "timed_fanned_steps", "flows": "one_step"}
STEPS = 10
HOLDERS = 64
REFERENCE = {  # Dex on a c7gd.large (2 vCPU, load generator on another machine), per second
    "sync_steps": 1772, "async_steps": 2105, "flows": 1111, "attr_read": 15392, "attr_update": 2165,
    "attr_read_10x16k": 5941, "channel_wake": 460}
TARGETS = {"sync_steps": 2700, "async_steps": 3000, "flows": 1200, "attr_read": 15000, "attr_update": 2200,
           "channel_wake": 700}
UNITS = {"sync_steps": "steps/s", "async_steps": "steps/s", "fanned_steps": "steps/s"}
PEERS = ("restate", "dbos")


class Scenario:
    """Setup (untimed) and one operation (timed) of a scenario; `per_op` steps per operation."""

    def __init__(self, client: FlowClient, name: str) -> None:
        self.client = client
        self.name = name
        self.per_op = STEPS if UNITS.get(name) == "steps/s" else 1
        self.runs: list[str] = []
        self.step_samples: list[tuple[float, list[float]]] = []   # (when the flow ended, each step's ms)

    async def setup(self) -> None:
        if self.name in ("attr_read", "attr_update", "attr_read_10x16k"):
            attrs = {f"k{i}": "x" * (16 * 1024) for i in range(10)} if self.name == "attr_read_10x16k" else {"a": 1}
            count = 16 if self.name == "attr_read_10x16k" else HOLDERS
            starts = [await self.client.start("holder", attrs) for _ in range(count)]
            self.runs = [s["run_id"] for s in starts]
            deadline = time.monotonic() + 60
            for run_id in self.runs:  # wait until every holder has written its attributes
                while len(await self.client.attributes(run_id)) < len(attrs):
                    if time.monotonic() > deadline:
                        raise RuntimeError("holder runs did not set their attributes: are workers running?")
                    await asyncio.sleep(0.05)

    async def op(self, index: int, n: int) -> float | None:
        """One operation; returns its latency in ms (None: timed by the operation itself)."""
        c = self.client
        if self.name in STEP_FLOWS:
            flow = STEP_FLOWS[self.name]
            run = await c.start(flow, STEPS)
            done = await c.get(run["run_id"], wait=60)
            if done["status"] != "completed":
                raise RuntimeError(f"{flow} ended {done['status']}: {done.get('error')}")
            if isinstance(done.get("result"), list):
                self.step_samples.append((asyncio.get_running_loop().time(), done["result"]))
            return None
        run_id = self.runs[(index + n) % len(self.runs)] if self.runs else ""
        if self.name == "attr_read":
            await c.attributes(run_id, ["a"])
        elif self.name == "attr_read_10x16k":
            await c.attributes(run_id)
        elif self.name == "attr_update":
            await c.update(run_id, "count", "incr", 1)
        elif self.name == "channel_wake":
            run = await c.start("woken", None)
            if (await c.get(run["run_id"], wait=60, until="suspended"))["status"] != "suspended":
                raise RuntimeError("the woken flow did not reach its wait")
            published = time.time()
            await c.publish(run["run_id"], "wake", None)
            done = await c.get(run["run_id"], wait=60)
            return (done["result"] - published) * 1000.0
        return None


async def run_ours(server: ServerProcess, worker_pids: list[int], scenario: str, clients: int, warmup: float,
                   duration: float, s3_pids: list[int] = ()) -> dict[str, Any]:
    """One closed-loop run; `s3_pids`: the S3 emulator's processes, whose CPU is reported too
    (on this machine it shares the cores with the server)."""
    bus = Bus(f"bench/{os.getpid()}", f"ipc://{server.rundir}/broker.sock", role="bench")
    await bus.start()
    try:
        flows = FlowClient(bus, shards=int(server.config["kernel"].get("actors") or os.cpu_count() or 1),
                           timeout=120.0)
        sc = Scenario(flows, scenario)
        await sc.setup()
        server_pids = list(server.pids().values())
        fsyncs0 = scrape(server.url, "agentos_log_fsyncs_total")
        puts0 = scrape(server.url, PUTS)

        async def sampled():
            await asyncio.sleep(warmup)
            return tree_cpu(server_pids), tree_cpu(worker_pids), tree_cpu(s3_pids), time.monotonic()

        sampler = asyncio.create_task(sampled())
        window_start = asyncio.get_running_loop().time() + warmup
        ops, latencies, errors, window, work = await closed_loop(sc.op, clients, warmup, duration)
        if sc.per_op > 1:
            ops = work   # steps by the share of each flow inside the window (see closed_loop)
        latencies.sort()
        steps = sorted(ms for at, took in sc.step_samples if window_start <= at <= window_start + duration
                       for ms in took)
        server0, workers0, s3_0, t0 = await sampler
        elapsed = time.monotonic() - t0
        await asyncio.sleep(1.2)  # metrics are flushed about once a second
        fsyncs = scrape(server.url, "agentos_log_fsyncs_total") - fsyncs0
        puts = scrape(server.url, PUTS) - puts0
        server_cpu = cpu_delta(server0, tree_cpu(server_pids))
        worker_cpu = cpu_delta(workers0, tree_cpu(worker_pids))
        s3_cpu = cpu_delta(s3_0, tree_cpu(s3_pids))
    finally:
        await bus.close()
    return {"system": "agent-os", "scenario": scenario, "clients": clients, "unit": UNITS.get(scenario, "ops/s"),
            "ops_per_sec": round(ops * sc.per_op / window, 1),
            "p50_ms": round(percentile(latencies, 50), 3) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 3) if latencies else None, "errors": errors, "window_secs": window,
            "step_p50_ms": round(percentile(steps, 50), 3) if steps else None,
            "step_p99_ms": round(percentile(steps, 99), 3) if steps else None,
            "server_cpu_percent": round(100 * server_cpu / elapsed, 1),
            "worker_cpu_percent": round(100 * worker_cpu / elapsed, 1),
            "s3_cpu_percent": round(100 * s3_cpu / elapsed, 1) if s3_pids else None,
            "fsyncs_per_sec": round(fsyncs / (elapsed + 1.2), 1),
            "puts_per_sec": round(puts / (elapsed + 1.2), 1) if puts else None,
            "per_put": round(ops * sc.per_op / window / (puts / (elapsed + 1.2)), 1) if puts else None}


def half_peak_clients(server: ServerProcess, worker_pids: list[int], peak: dict, args: argparse.Namespace,
                      s3_pids: list[int]) -> int:
    """The client count whose throughput comes nearest half the peak's: one short probe run each
    of an eighth, a quarter and a half of the peak's clients."""
    best, best_gap = 1, float("inf")
    for n in sorted({max(1, peak["clients"] // d) for d in (8, 4, 2)}):
        probe = asyncio.run(run_ours(server, worker_pids, "async_steps", n, args.warmup, args.duration / 2, s3_pids))
        gap = abs(probe["ops_per_sec"] / peak["ops_per_sec"] - 0.5)
        print(f"  half-peak probe c={n}: {probe['ops_per_sec']:.1f} steps/s "
              f"({100 * probe['ops_per_sec'] / peak['ops_per_sec']:.0f}% of the peak)", file=sys.stderr)
        if gap < best_gap:
            best, best_gap = n, gap
    return best


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent-os bench steps", description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--clients", default="",
                   help="SCENARIO=N,... (defaults per scenario); N/N/... measures each count in turn")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=3, help="runs per scenario; the median is reported")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=0,
                   help="steps each worker runs at once (0: enough for the largest client count, at least 256)")
    p.add_argument("--durability", default="local", type=_durabilities,
                   help="local, none or s3; several (local,s3): a tree each, side by side, taking turns run by run; "
                        "compared in the summary")
    p.add_argument("--half-peak", action="store_true",
                   help="also run async_steps at the client count nearest half its peak throughput")
    p.add_argument("--s3-max-inflight", type=int, default=0,
                   help="storage.s3.max_inflight_puts of the s3 runs (0: the server's default)")
    p.add_argument("--idle-secs", type=float, default=20.0,
                   help="with s3: first measure the object-storage requests of the idle node this long (0: skip)")
    p.add_argument("--peer", default="", type=_peers,
                   help="also run the scenarios against: restate, dbos (DBOS Transact on a private PostgreSQL), "
                        "or both (restate,dbos)")
    p.add_argument("--name", default="steps")
    p.add_argument("--results-root", default=None)
    return p.parse_args(argv)


def _peers(text: str) -> str:
    if any(peer not in PEERS for peer in _csv(text)):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(PEERS)}")
    return text


def _durabilities(text: str) -> str:
    modes = _csv(text)
    if not modes or any(m not in ("local", "none", "s3") for m in modes):
        raise argparse.ArgumentTypeError("a comma-separated list of local, none, s3")
    return ",".join(modes)


def median_row(rows: list[dict]) -> dict:
    ordered = sorted(rows, key=lambda r: r["ops_per_sec"])
    row = dict(ordered[len(ordered) // 2])
    row["runs"] = [r["ops_per_sec"] for r in rows]
    return row


class Tree:
    """A process tree of one durability (for s3, with its own moto server) and its workers."""

    def __init__(self, durability: str, args: argparse.Namespace) -> None:
        self.durability = durability
        self.args = args
        config: dict[str, Any] = {"storage": {"durability": durability}, "mock": {"ttft_ms": 10}}
        env = None
        self.s3 = None
        self.server: ServerProcess | None = None
        self.workers: list = []
        if durability == "s3":
            from bench.s3_local import CREDENTIALS, S3Server
            self.s3 = S3Server()  # moto's S3 server on loopback, started for this tree
            config.update(self.s3.storage_config(self.s3.new_bucket(), direct=True))
            if args.s3_max_inflight:
                config["storage"]["s3"]["max_inflight_puts"] = args.s3_max_inflight
            config["cluster"] = {}
            env = CREDENTIALS
        try:
            self.server = ServerProcess.temporary(f"bench-steps-{durability}-", config, env).start()
            self.workers = start_workers(self.server, args.workers, args.slots)
        except BaseException:
            self.close()
            raise
        self.worker_pids = [p.pid for p in self.workers]
        self.s3_pids = [self.s3.proc.pid] if self.s3 is not None else []

    def run(self, scenario: str, n: int, label: str = "", index: int = 0) -> dict:
        row = asyncio.run(run_ours(self.server, self.worker_pids, scenario, n, self.args.warmup, self.args.duration,
                                   self.s3_pids))
        print(f"  agent-os/{self.durability} {scenario + label:<17} c={n:<4} run {index + 1}: "
              f"{row['ops_per_sec']:>9.1f} {row['unit']}  p50 {row['p50_ms'] or 0:.2f} ms  "
              f"p99 {row['p99_ms'] or 0:.2f} ms  step p50 {row['step_p50_ms'] or 0:.3f} ms  "
              f"errors {row['errors']}", file=sys.stderr)
        return row

    def close(self) -> None:
        stop_workers(self.workers)
        if self.server is not None:
            self.server.stop()
        if self.s3 is not None:
            self.s3.stop()


def run_agentos(args: argparse.Namespace, scenarios: list[str], clients: dict[str, list[int]],
                results: ResultsDir, rows: list[dict]) -> None:
    """Every point against a tree of each durability. The trees stand side by side (an idle one
    costs next to nothing) and every run of a point goes through them in turn, in reverse order
    every other time, so the machine's drift over the command falls on each durability alike.
    Appends a row per point and durability (the median of its runs) to `rows` and the folder."""
    modes = args.durability.split(",")
    trees: dict[str, Tree] = {}
    turn = 0

    def point(scenario: str, counts: dict[str, int], label: str = "", **extra: Any) -> dict[str, dict]:
        nonlocal turn
        runs: dict[str, list[dict]] = {m: [] for m in counts}
        for i in range(args.runs):
            for mode in (modes if turn % 2 == 0 else modes[::-1]):
                if mode in counts:
                    runs[mode].append(trees[mode].run(scenario, counts[mode], label, i))
            turn += 1
        out = {}
        for mode, got in runs.items():
            out[mode] = row = {**median_row(got), "durability": mode, **extra}
            rows.append(row)
            results.append_row(row)
        return out

    try:
        for mode in modes:
            trees[mode] = Tree(mode, args)
        if "s3" in trees and args.idle_secs:
            time.sleep(2.0)   # past the start's own requests
            row = {**idle_requests(trees["s3"].server.url, args.idle_secs), "durability": "s3"}
            print(f"  agent-os/s3 idle for {args.idle_secs:g} s: {row['puts_per_sec']} PUTs/s "
                  f"{row['requests_per_sec']}", file=sys.stderr)
            rows.append(row)
            results.append_row(row)
        for scenario in scenarios:
            peaks: dict[str, dict] = {}
            for n in clients[scenario]:
                for mode, row in point(scenario, {m: n for m in modes}).items():
                    if mode not in peaks or row["ops_per_sec"] > peaks[mode]["ops_per_sec"]:
                        peaks[mode] = row
            if args.half_peak and scenario == "async_steps":
                for mode, peak in peaks.items():
                    tree = trees[mode]
                    n = half_peak_clients(tree.server, tree.worker_pids, peak, args, tree.s3_pids)
                    point(scenario, {mode: n}, " (half)", half_peak_of=peak["ops_per_sec"])
    finally:
        for tree in trees.values():
            tree.close()


def _csv(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def run_peer(peer: str, args: argparse.Namespace, scenarios: list[str], clients: dict[str, list[int]],
             results: ResultsDir, rows: list[dict]) -> None:
    """Every point the peer offers, `args.runs` times each; a row per point (the median run)."""
    if peer == "restate":
        from bench.peer_restate import SCENARIOS as offered, RestateServer as Peer, run_scenario
    else:
        from bench.peer_dbos import SCENARIOS as offered, DbosPeer as Peer, run_scenario
    with Peer() as server:
        for scenario in (s for s in scenarios if s in offered):
            for n in clients[scenario]:
                runs = [run_scenario(server, scenario, n, args.warmup, args.duration) for _ in range(args.runs)]
                for r in runs:
                    r["system"] = peer
                row = median_row(runs)
                rows.append(row)
                results.append_row(row)
                print(f"  {peer:<8} {scenario:<17} c={n:<4} {row['ops_per_sec']:>9.1f}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from bench.steps_report import write_report

    args = parse_args(argv)
    clients = {name: [n] for name, n in DEFAULT_CLIENTS.items()}
    for item in filter(None, args.clients.split(",")):
        name, _, value = item.partition("=")
        clients[name] = [int(v) for v in value.split("/")]
    if not args.slots:  # every client's step can be running at once
        most = max(n for s in args.scenarios.split(",") if s for n in clients.get(s, [0]))
        args.slots = max(256, -(-most // args.workers))
    scenarios = [s for s in args.scenarios.split(",") if s]
    results = ResultsDir(args.name, Path(args.results_root) if args.results_root else None)
    cpu = python_workload()   # this VM's speed moves by the hour: the runs are read beside it
    print(f"fixed Python workload: {cpu['p50_us']} µs per iteration", file=sys.stderr)
    results.write_config({"command": "bench steps", "args": vars(args), "clients": clients, "python_workload": cpu})
    (results.path / "rows.jsonl").unlink(missing_ok=True)
    rows: list[dict] = []
    run_agentos(args, scenarios, clients, results, rows)
    for peer in _csv(args.peer):
        run_peer(peer, args, scenarios, clients, results, rows)
    write_report(results, rows, args, REFERENCE, TARGETS, cpu)
    print(f"results: {results.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
