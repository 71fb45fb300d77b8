"""The step scenarios as a DBOS Transact application, and their closed-loop load in the same process
(DBOS is a library: its workflows run in the application that starts them, on PostgreSQL).

    python -m bench.dbos_app --dsn postgresql://… --scenario sync_steps --clients 128 \\
        --warmup 3 --duration 10 --postgres-pid 1234      # prints one JSON row

Run by bench/peer_dbos.py, one process per run, so each run starts DBOS afresh and its CPU is
its own. What each scenario does, as close to ours (bench/steps.py) as DBOS offers:

| scenario       | one operation                                                                |
|----------------|------------------------------------------------------------------------------|
| `sync_steps`   | a workflow of 10 steps awaited one by one, started and awaited (each step's  |
|                | output is committed before the next runs: DBOS steps are all "SYNC")         |
| `flows`        | a workflow with one step, started and awaited                                |
| `attr_read`    | `get_event` of a value a holder workflow set (DBOS has no attributes; an     |
|                | event is the value a workflow publishes for others to read)                  |
| `channel_wake` | a workflow that `recv`s on a topic is started and reaches its wait; then     |
|                | `send`; timed from the send to the start of the step after the `recv`        |

Not offered: `async_steps` (a DBOS step is always durable before the workflow goes on),
`attr_update` (no locked read-modify-write of a workflow's value), `attr_read_10x16k`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

SCENARIOS = ("sync_steps", "flows", "attr_read", "channel_wake")
STEPS = 10
HOLDERS = 64
READY_TIMEOUT_SECS = 60.0


def build(dsn: str, clients: int):
    """DBOS configured on `dsn`, its workflows registered (before launch, as DBOS requires). Its
    connection pool is sized for the clients (DBOS's default is smaller than the largest count),
    everything else is DBOS's default."""
    from dbos import DBOS

    DBOS(config={"name": "agentos-bench", "system_database_url": dsn, "log_level": "WARNING",
                 "application_version": "bench", "sys_db_pool_size": max(20, clients + 8)})

    @DBOS.step()
    async def noop_step(i: int) -> int:
        return i

    @DBOS.step()
    async def woken_step() -> float:
        return time.time()

    @DBOS.workflow()
    async def timed_sync_steps(n: int) -> list[float]:
        took = []
        for i in range(n):
            began = time.perf_counter()
            await noop_step(i)
            took.append((time.perf_counter() - began) * 1000.0)
        return took

    @DBOS.workflow()
    async def one_step() -> int:
        return await noop_step(0)

    @DBOS.workflow()
    async def holder() -> None:
        await DBOS.set_event_async("a", 1)

    @DBOS.workflow()
    async def woken() -> float:
        await DBOS.set_event_async("ready", True)
        await DBOS.recv_async("wake", timeout_seconds=READY_TIMEOUT_SECS)
        return await woken_step()

    return DBOS, {"timed_sync_steps": timed_sync_steps, "one_step": one_step, "holder": holder, "woken": woken}


class Scenario:
    def __init__(self, dbos, flows: dict, name: str) -> None:
        self.dbos, self.flows, self.name = dbos, flows, name
        self.holders: list[str] = []
        self.step_samples: list[tuple[float, list[float]]] = []

    async def setup(self) -> None:
        if self.name == "attr_read":
            for _ in range(HOLDERS):
                handle = await self.dbos.start_workflow_async(self.flows["holder"])
                await handle.get_result()
                self.holders.append(handle.get_workflow_id())

    async def op(self, index: int, n: int) -> float | None:
        dbos = self.dbos
        if self.name == "sync_steps":
            handle = await dbos.start_workflow_async(self.flows["timed_sync_steps"], STEPS)
            self.step_samples.append((asyncio.get_running_loop().time(), await handle.get_result()))
        elif self.name == "flows":
            await (await dbos.start_workflow_async(self.flows["one_step"])).get_result()
        elif self.name == "attr_read":
            if await dbos.get_event_async(self.holders[(index + n) % len(self.holders)], "a", 10) != 1:
                raise RuntimeError("the holder's event is not there")
        elif self.name == "channel_wake":
            handle = await dbos.start_workflow_async(self.flows["woken"])
            run_id = handle.get_workflow_id()
            if not await dbos.get_event_async(run_id, "ready", READY_TIMEOUT_SECS):
                raise RuntimeError("the woken workflow did not reach its wait")
            sent = time.time()
            await dbos.send_async(run_id, None, "wake")
            return (await handle.get_result() - sent) * 1000.0
        return None


async def measure(args: argparse.Namespace) -> dict:
    from bench.checkpoint_targets import process_tree_cpu_secs
    from bench.stats import percentile
    from bench.steps_measure import closed_loop

    dbos, flows = build(args.dsn, args.clients)
    dbos.launch()
    try:
        sc = Scenario(dbos, flows, args.scenario)
        await sc.setup()
        loop = asyncio.get_running_loop()
        window_start = loop.time() + args.warmup

        async def sampled():
            await asyncio.sleep(args.warmup)
            return time.process_time(), process_tree_cpu_secs([args.postgres_pid]), time.monotonic()

        sampler = asyncio.create_task(sampled())
        ops, latencies, errors, window, work = await closed_loop(sc.op, args.clients, args.warmup, args.duration)
        own0, pg0, t0 = await sampler
        elapsed = time.monotonic() - t0
        own, pg = time.process_time() - own0, process_tree_cpu_secs([args.postgres_pid]) - pg0
    finally:
        dbos.destroy()
    per_op = STEPS if args.scenario == "sync_steps" else 1
    if per_op > 1:
        ops = work   # steps by the share of each workflow inside the window, as ours are counted
    latencies.sort()
    steps = sorted(ms for at, took in sc.step_samples if window_start <= at <= window_start + args.duration
                   for ms in took)
    return {"system": "dbos", "scenario": args.scenario, "clients": args.clients,
            "unit": "steps/s" if per_op > 1 else "ops/s", "ops_per_sec": round(ops * per_op / window, 1),
            "p50_ms": round(percentile(latencies, 50), 3) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 3) if latencies else None,
            "step_p50_ms": round(percentile(steps, 50), 3) if steps else None,
            "step_p99_ms": round(percentile(steps, 99), 3) if steps else None,
            "errors": errors, "window_secs": window,
            "app_cpu_percent": round(100 * own / elapsed, 1), "postgres_cpu_percent": round(100 * pg / elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dbos_app", description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--postgres-pid", type=int, default=0)
    args = p.parse_args(argv)
    if os.environ.get("DBOS_BENCH_UVLOOP"):
        import uvloop
        uvloop.install()
    row = asyncio.run(measure(args))
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
