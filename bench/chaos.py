"""`agent-os bench chaos --minutes N`: mixed load while a random role is killed with SIGKILL every
few seconds, then an accounting done by the load generator itself.

Load (bench/chaos_clients.py): turn clients (SSE, resumed with Last-Event-ID when a connection
drops; every fourth time two turns at once on the session, one superseding the other; every third
a turn whose model calls two tools at once; every seventh time a turn cancelled a few milliseconds
in, or while its tools run), checkpoint clients (numbered PUTs per session), flow
clients (runs of SYNC steps started with an Idempotency-Key, every third in a flow queue of 2 places
and 10 admissions a second, with priorities, and another third running their steps at once, then
two children at once), close clients (a session filled, then closed), forks
of some runs and sessions (bench/chaos_forks.py), and a schedule that starts a run every second
(bench/chaos_schedules.py), on one real process tree with full persistence and one worker process.
Every few seconds (jittered) one role of the tree — broker, gateway, an actor, the scheduler, a log
writer, the store writer or the mock model — gets SIGKILL, in a shuffled order that reaches every
role once per round; the supervisor restarts it. Optionally also: roles stopped for seconds and
continued (`--stall-every`, bench/chaos_faults.py), a log that rotates and compacts all the time
(`--busy-log`), acks that wait for a bucket (`--bucket`, moto) and that bucket going away now and
then (`--bucket-outages`).

The accounting, after the kills stop and the tree has settled:
- lost: acknowledged records that are not there. A completed turn whose assistant message is not
  in the transcript (or differs from what was streamed); an acknowledged checkpoint that is not in
  the log; an accepted flow run (or fork of one, or a second of the schedule) that never completes
  with its result; a session
  whose close was acknowledged that a read still finds (bench/chaos_closes.py); an acknowledged
  fork of a session that does not hold the messages it was answered with.
- hung: streams that neither ended with a terminal event nor closed cleanly within the deadline.
- failed turns by their error code: `bad_request` is the provider refusing a session's history
  (as OpenAI's API refuses one with a tool call left unanswered).
- restarts per role, and each process's private memory after warm-up and after the run.
- the JSON-lines copy of the events (on in this run): every event the logs hold is one line of
  it, though writer/store was killed mid-load (bench/chaos_jsonl.py).
Exit status 1 if anything was lost or hung, or that copy is not whole.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.logged_checkpoints import checkpoints_in_log, lost_from_log
from bench import chaos_jsonl
from bench.chaos_closes import close_client, closable, reopened
from bench.chaos_clients import FLOW_STEPS, QUEUE, QUEUE_LIMIT, Ledger, checkpoint_client, flow_client, turn_client
from bench.chaos_forks import unforked
from bench.chaos_report import accounting, write_report
from bench.chaos_schedules import delete_schedule, expected_runs, make_schedule
from bench.chaos_faults import outager, staller, stopped_within
from bench.results import ResultsDir
from bench.s3_local import CREDENTIALS, S3Server
from bench.sampling import memory_by_process
from bench.server_log import logged_errors
from bench.server_proc import ServerProcess, deep_merge, pid_alive, wait_until
from bench.step_workers import start_workers, stop_workers

VERIFY_CONCURRENCY = 16     # runs asked at once when the load has stopped
VERIFY_SECS_PER_RUN = 0.02  # the wait for runs to finish grows by this for each run to ask


def killable(pids: dict[str, int]) -> list[str]:
    """Every supervised role but the supervisor itself (its death takes the whole tree)."""
    return sorted(name for name in pids if name != "supervisor")


async def killer(server: ServerProcess, every: float, rng: random.Random, stop: asyncio.Event,
                 kills: list[dict], t0: float, roles: list[str]) -> None:
    deck: list[str] = []
    roster: list[str] = []
    while not await stopped_within(stop, every * rng.uniform(0.5, 1.5)):
        try:
            pids = server.pids()
        except (OSError, ValueError):
            continue
        roster = roster or [r for r in killable(pids) if not roles or r in roles]
        if not deck:   # a shuffled deck of the roles: random order, every role once per round
            deck = list(roster)
            rng.shuffle(deck)
            if not deck:
                continue
        # one still restarting from an earlier kill waits its turn; so does one dead and not yet
        # reaped (a slow supervisor's table still names it): a SIGKILL to it kills nothing
        up = [r for r in deck if r in pids and pid_alive(pids[r])]
        if not up:
            continue
        role = up[-1]
        deck.remove(role)
        try:
            os.kill(pids[role], signal.SIGKILL)
        except ProcessLookupError:
            continue
        server.seen_pids.add(pids[role])
        kills.append({"t": round(time.monotonic() - t0, 2), "role": role, "pid": pids[role]})
        print(f"  {kills[-1]['t']:7.1f}s  SIGKILL {role} (pid {pids[role]})", file=sys.stderr)


async def load(server: ServerProcess, args, ledger: Ledger, kills: list[dict], s3: S3Server | None = None,
               outages: list[dict] | None = None, stalls: list[dict] | None = None) -> dict:
    """Warm up, take the memory baseline, run the kills (and the stalls, and the bucket's
    outages), stop, let every stream finish."""
    stop_load, stop_kills = asyncio.Event(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        base = server.url
        tasks = [asyncio.ensure_future(turn_client(http, base, i, ledger, stop_load, args.deadline, args.pause))
                 for i in range(args.turn_clients)]
        tasks += [asyncio.ensure_future(checkpoint_client(http, base, i, ledger, stop_load, args.pause))
                  for i in range(args.checkpoint_clients)]
        tasks += [asyncio.ensure_future(flow_client(http, base, i, ledger, stop_load, args.pause))
                  for i in range(args.flow_clients)]
        tasks += [asyncio.ensure_future(close_client(http, base, i, ledger.closed, ledger.close_errors, stop_load,
                                                     args.deadline, args.pause)) for i in range(args.close_clients)]
        made = await make_schedule(http, base, "sync_steps", FLOW_STEPS)
        await asyncio.sleep(args.warmup)
        before = memory_by_process(server)
        chaos_from = time.monotonic() - ledger.t0
        chaos = [asyncio.ensure_future(killer(server, args.kill_every, random.Random(args.seed), stop_kills,
                                              kills, ledger.t0, args.roles))]
        if args.stall_every:
            chaos.append(asyncio.ensure_future(staller(server, args.stall_every, random.Random(args.seed + 1),
                                                       stop_kills, stalls, ledger.t0, args.roles)))
        if s3 is not None and args.bucket_outages:
            chaos.append(asyncio.ensure_future(outager(s3.proxy, args.bucket_outages, random.Random(-args.seed),
                                                       stop_kills, outages, ledger.t0)))
        await asyncio.sleep(args.duration)
        stop_kills.set()
        await asyncio.gather(*chaos)
        chaos_to = time.monotonic() - ledger.t0
        await asyncio.sleep(args.cooldown)     # load goes on while the last restarts finish
        stop_load.set()
        phase(ledger, "load stopped: waiting for the clients' last streams")
        await asyncio.gather(*tasks)
        scheduled = expected_runs(made, await delete_schedule(http, base))
        ledger.flows.update(dict.fromkeys(scheduled, "schedule"))
        ledger.forks["scheduled"] = len(scheduled)
    return {"before": before, "chaos_from": chaos_from, "chaos_to": chaos_to}


async def emitted_once(http: aiohttp.ClientSession, base: str, run_id: str) -> bool:
    """Whether a `chosen` run's emitted values are its one, `{"took": channel}` (a replay emits
    nothing again), as its reader finds them; False also when they cannot be read now."""
    try:
        async with http.get(f"{base}/v1/runs/{run_id}/emitted", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            body = await resp.json()
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
        return False
    values = [e["value"] for e in body.get("emitted", [])] if resp.status == 200 else []
    return len(values) == 1 and values[0] in ({"took": "approve"}, {"took": "reject"})


async def verify(server: ServerProcess, ledger: Ledger, timeout: float) -> dict[str, Any]:
    """Ask the settled server for everything it acknowledged."""
    lost: dict[str, list] = {"turns": [], "flows": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        by_session: dict[str, dict[str, str]] = collections.defaultdict(dict)
        for session, turn_id, text in ledger.completed:
            by_session[session][turn_id] = text
        for session, wanted in by_session.items():
            stored: dict[str, str] = {}
            after = -1
            while after is not None:
                async with http.get(f"{server.url}/v1/sessions/{session}/messages",
                                    params={"after": str(after), "limit": "1000"}) as resp:
                    body = await resp.json()
                stored.update({m["turn_id"]: m["content"] for m in body["messages"] if m["role"] == "assistant"})
                after = body["next_after"]
            lost["turns"] += [(session, t) for t, text in wanted.items() if stored.get(t) != text]
        # Every run is asked at least once, VERIFY_CONCURRENCY at a time, each request bounded; the
        # wait for runs still going is bounded as a whole (a stalled shard answers nothing), and
        # grows with how many runs there are to ask.
        deadline = time.monotonic() + timeout + VERIFY_SECS_PER_RUN * len(ledger.flows)
        pending = dict(ledger.flows)
        results: collections.Counter = collections.Counter()
        gate = asyncio.Semaphore(VERIFY_CONCURRENCY)
        unseen: set[str] = set()

        async def check(run_id: str) -> None:
            async with gate:
                if time.monotonic() >= deadline:
                    return
                try:
                    async with http.get(f"{server.url}/v1/runs/{run_id}",
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        body = await resp.json()
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    return   # still pending
            if resp.status == 404 and ledger.flows[run_id] == "schedule":
                unseen.add(run_id)   # a schedule's time is started by its actor, retried until it gets through
                return
            unseen.discard(run_id)
            if resp.status == 404 or body.get("status") in ("completed", "failed", "cancelled"):
                pending.pop(run_id)
                ok = resp.status == 200 and body["status"] == "completed" and body.get("result") == FLOW_STEPS
                if ok and run_id in ledger.emitting:   # its one value, once (GET /v1/runs/{id}/emitted)
                    ok = await emitted_once(http, server.url, run_id)
                outcome = "not found" if resp.status == 404 else body["status"]
                results["completed with a wrong result" if outcome == "completed" and not ok else outcome] += 1
                if not ok:
                    lost["flows"].append(run_id)

        while pending and time.monotonic() < deadline:
            await asyncio.gather(*(check(run_id) for run_id in list(pending)))
            if pending:
                await asyncio.sleep(0.5)
        lost["flows"] += list(pending)
        absent = len(unseen & pending.keys())
        results["unfinished"] = len(pending) - absent
        if absent:
            results["schedule time never started"] = absent
        lost["closes"] = await reopened(http, server.url, ledger.closed)
        lost["session_forks"] = await unforked(http, server.url, ledger.session_forks)
    return {"lost": lost, "flow_results": dict(results)}


def restarts_by_role(server: ServerProcess) -> dict[str, int]:
    table = server.table()
    return {**{row["name"]: row["restarts"] for row in table["children"]}, "forkserver": table["forkserver"]["restarts"]}


def phase(ledger: Ledger, what: str) -> None:
    """Where the run is, on stderr beside the kills: a slow run's output says which wait was long."""
    print(f"  {time.monotonic() - ledger.t0:7.1f}s  {what}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent-os bench chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long roles are killed")
    p.add_argument("--seconds", type=float, default=None, help="the same in seconds (overrides --minutes)")
    p.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills (jittered ±50%%)")
    p.add_argument("--warmup", type=float, default=15.0, help="load before the first kill (memory baseline)")
    p.add_argument("--cooldown", type=float, default=10.0, help="load after the last kill")
    p.add_argument("--deadline", type=float, default=60.0, help="a stream not ended by then is hung")
    p.add_argument("--turn-clients", type=int, default=16)
    p.add_argument("--checkpoint-clients", type=int, default=4)
    p.add_argument("--flow-clients", type=int, default=4)
    p.add_argument("--close-clients", type=int, default=2, help="clients that fill a session, then close it")
    p.add_argument("--pause", type=float, default=0.05, help="each client's think time between requests")
    p.add_argument("--roles", type=lambda v: [r for r in v.split(",") if r], default=[],
                   help="kill (and stall) only these roles (comma-separated names as `agent-os status` shows them)")
    p.add_argument("--busy-log", action="store_true",
                   help="1 MiB log segments and a compaction pass every 2 s: kills land in rotations, rewrites "
                        "and installs")
    p.add_argument("--bucket", action="store_true",
                   help="durability s3 on a local S3 endpoint (moto): acks wait for the bucket, a restarted log "
                        "writer restores from it")
    p.add_argument("--stall-every", type=float, default=0.0, metavar="SECS",
                   help="also stop a random role with SIGSTOP for 2-6 s every SECS or so (bench/chaos_faults.py)")
    p.add_argument("--bucket-outages", type=float, default=0.0, metavar="SECS",
                   help="with --bucket: it goes away for 2-4 s every SECS or so (refused or 503)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", default="chaos")
    p.add_argument("--results-root", default=None, help="where the results folder goes (default bench/results)")
    args = p.parse_args(argv)
    if args.bucket_outages and not args.bucket:
        p.error("--bucket-outages needs --bucket")
    args.duration = args.seconds if args.seconds is not None else args.minutes * 60
    return args


def server_config(jsonl_dir: Path, busy_log: bool = False, bucket: dict | None = None) -> dict[str, Any]:
    config = {"storage": {"durability": "local", "jsonl_dir": str(jsonl_dir)},
              "kernel": {"actors": 2, "max_in_flight_turns": 0, "disconnect_grace_secs": 10,
                         "flow_queues": f"{QUEUE}={QUEUE_LIMIT}"},
              "mock": {"ttft_ms": 50, "tokens": 24, "tps": 400},
              "provider": {"timeout_secs": 20}}
    if busy_log:
        config["storage"].update({"segment_bytes": 1 << 20, "spare_segments": 1, "compaction_interval_secs": 2.0,
                                  "payload_compaction_min_mb": 0.0})
    if bucket is not None:
        config = deep_merge(config, bucket)
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = ResultsDir(args.name, Path(args.results_root) if args.results_root else None)
    # SIGTERM (a CI timeout, ^C from a wrapper) still stops the tree: it unwinds through `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    s3 = S3Server() if args.bucket else None
    env = CREDENTIALS if s3 else None
    # through the fault proxy only when it is to fail: it is a thread per connection in this process
    bucket = s3.storage_config(s3.new_bucket(), direct=not args.bucket_outages) if s3 else None
    config = server_config(work / "jsonl", args.busy_log, bucket)
    results.write_config({"command": "bench chaos", "args": vars(args), "server": config})
    ledger, kills, outages, stalls = Ledger(), [], [], []
    try:
        server = ServerProcess(work, config, env).start()
        workers: list = []
        try:
            workers = start_workers(server, 1, 16)
            print(f"chaos: {args.duration:.0f}s of kills every ~{args.kill_every}s on {server.url}", file=sys.stderr)
            phases = asyncio.run(load(server, args, ledger, kills, s3, outages, stalls))
            phase(ledger, "clients done: waiting for the tree to be ready")
            server.wait_ready(120)
            wait_until(lambda: all(r["pid"] for r in server.table()["children"]), 60, "every role to be running")
            phase(ledger, "verifying what was acknowledged")
            checked = asyncio.run(verify(server, ledger, timeout=max(60.0, args.deadline)))
            phase(ledger, "verified")
            time.sleep(2.0)
            after = memory_by_process(server)
            restarts = restarts_by_role(server)
        finally:
            phase(ledger, "stopping the tree")
            stop_workers(workers)
            server.stop()
            phase(ledger, "stopped")
        in_log = checkpoints_in_log(work / "data")
        jsonl = chaos_jsonl.compare(chaos_jsonl.events_in_log(work / "data"),
                                    *chaos_jsonl.events_in_file(work / "jsonl"), closable)
    finally:
        # the tree's and the worker's own account of the run, also of one that failed or was
        # stopped: what to read first when something was lost or hung
        for log in [*work.glob("server-*.log"), *work.glob("worker-*.log")]:
            shutil.copyfile(log, results.path / ("server.log" if log.name.startswith("server-") else log.name))
        shutil.rmtree(work, ignore_errors=True)
        if s3 is not None:
            s3.stop()
    lost_checkpoints = lost_from_log(ledger.checkpoints, in_log)
    row = accounting(args, ledger, kills, checked, lost_checkpoints, restarts, phases, after)
    row["jsonl"] = jsonl
    row["bucket_outages"] = outages
    row["stalls"] = stalls
    # the logs' own word on the run: a kill is a WARNING, a bug of ours under kills an ERROR
    logged = {log.name: logged_errors(log) for log in sorted(results.path.glob("*.log"))}
    row["logged_errors"] = {name: count for name, (count, _) in logged.items()}
    row["logged_error_lines"] = [line for _, lines in logged.values() for line in lines]
    results.write_rows([row])
    results.write_rows(kills, "kills.jsonl")
    results.write_rows([{"t": t, **counts} for t, counts in sorted(ledger.timeline.items())], "timeline.jsonl")
    write_report(results, row, kills, ledger, phases)
    print(results.path / "summary.md", file=sys.stderr)
    print((results.path / "summary.md").read_text())
    whole_copy = jsonl["missing"] == jsonl["extra"] == jsonl["bad_lines"] == 0
    return 0 if row["lost"] == 0 and row["hung"] == 0 and whole_copy else 1


if __name__ == "__main__":
    sys.exit(main())
