"""The checkpoint workload and its runner: agents × tasks, a durable checkpoint after every step.

Owns: the scales, the payload schedule, the two modes, and the runner of one target — workers
taking agents from a shared queue, each agent's tasks in order, on one connection per worker
opened (and warmed by one op) before the first measured run — and the row of one run. Never does:
start servers, write files, or format tables (`bench.checkpoints` and `bench.checkpoint_report`).

Scale `1k` = 100 agents × 10 tasks, `10k` = 500 × 20, `100k` = 1000 × 100 (or `AxT`). Task j
(0-based) commits 2 KB + 2 KB·j bytes, capped at 64 KB, sliced from one pseudo-random buffer
made once. `write`: each task is one commit. `mixed`: each task first reads the agent's latest
checkpoint, then commits. Commit latency is the durable write; task latency is read + commit.
A failed op is counted by kind and left out of the latencies; the agent goes on with its next
task. Mixed-mode reads are checked too: after a successful commit of task j-1 the latest must be
j-1 with that task's payload length.

Between runs of one target the data stays (keys are deterministic per (agent, task), so later
runs overwrite, the article's steady state, unless `new_agents` gives each run agents of its
own); each row says which fraction of its keys existed.
Each row also says where the machine's CPU went (this client, the server when its process
groups are known, everything else): on two shared cores, load from elsewhere skews a run.
"""
from __future__ import annotations

import asyncio
import os
import random
import resource
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter

from bench import fsync_window
from bench.checkpoint_report import window_report
from bench.checkpoint_targets import CheckpointError, Latest, process_tree_cpu_secs
from bench.sampling import machine_busy_secs
from bench.server_log import LogWatch
from bench.stats import summarize

SCALES = {"1k": (100, 10), "10k": (500, 20), "100k": (1000, 100)}
MODES = ("write", "mixed")


@dataclass(frozen=True)
class Scale:
    name: str
    agents: int
    tasks: int

    @property
    def checkpoints(self) -> int:
        return self.agents * self.tasks


def parse_scale(text: str) -> Scale:
    """`1k`, `10k`, `100k`, or `AxT` (A agents × T tasks)."""
    if text in SCALES:
        return Scale(text, *SCALES[text])
    agents, sep, tasks = text.partition("x")
    if not sep or not agents.isdigit() or not tasks.isdigit() or not int(agents) or not int(tasks):
        raise ValueError(f"scale must be one of {sorted(SCALES)} or AxT, got {text!r}")
    return Scale(text, int(agents), int(tasks))


@dataclass
class BenchConfig:
    scales: tuple[str, ...] = ("1k", "10k")
    modes: tuple[str, ...] = MODES
    workers: int = 10
    repeat: int = 1
    op_timeout_secs: float = 60.0
    payload_base_bytes: int = 2048
    payload_step_bytes: int = 2048
    payload_cap_bytes: int = 64 * 1024
    payload_seed: int = 20240601
    agent_prefix: str = "bench-a"
    window_secs: float = 10.0
    fine_window_secs: float = 1.0
    min_windows: int = 3
    log_batches: bool = True   # read our log's batch histogram around each run (a second's wait each side)
    # Before its first run, each target takes this many MB of checkpoints (agents of their own,
    # not measured) and then rests: a store that has been running, not one just created.
    warm_up_mb: int = 0
    warm_up_idle_secs: float = 5.0
    # Each run on agents no earlier run used: every run a first insert, as a server whose
    # sessions come and go sees (its cache of latest checkpoints full of others).
    new_agents: bool = False

    def validate(self) -> None:
        for s in self.scales:
            parse_scale(s)
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be some of {MODES}, got {self.modes}")
        if self.workers < 1 or self.repeat < 1:
            raise ValueError("workers and repeat must be >= 1")
        if self.op_timeout_secs <= 0 or self.window_secs <= 0 or self.fine_window_secs <= 0:
            raise ValueError("timeouts and windows must be > 0")
        if self.warm_up_mb < 0 or self.warm_up_idle_secs < 0:
            raise ValueError("the warm-up's size and rest must be >= 0")
        if min(self.payload_base_bytes, self.payload_cap_bytes) < 1 or self.payload_step_bytes < 0:
            raise ValueError("payload sizes must be positive")


def payload_size(task: int, cfg: BenchConfig) -> int:
    """Bytes committed by task `task` (0-based): base + step·task, capped."""
    return min(cfg.payload_base_bytes + cfg.payload_step_bytes * task, cfg.payload_cap_bytes)


def make_payloads(tasks: int, cfg: BenchConfig) -> list[bytes]:
    """One payload per task index, all slices of one seeded pseudo-random (incompressible)
    buffer made once: no commit pays for generating its bytes."""
    buf = random.Random(cfg.payload_seed).randbytes(cfg.payload_cap_bytes)
    return [buf[:payload_size(j, cfg)] for j in range(tasks)]


# ------------------------------------------------------------------------------------ the run
class RunRecord:
    """What one run measured; times are perf_counter seconds, latencies milliseconds."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.commit_end = array("d")  # seconds since the run started
        self.commit_ms = array("d")
        self.task_ms = array("d")
        self.read_ms = array("d")
        self.errors: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    def check_read(self, latest: Latest | None, task: int, prev_ok: bool,
                   cfg: BenchConfig) -> None:
        if latest is None:
            self.reads["lost" if prev_ok else "miss"] += 1
            return
        self.reads["hit"] += 1
        if latest.nbytes is None:
            self.reads["dangling"] += 1  # the pointer names a checkpoint that is not there
        elif latest.task < 0 or latest.nbytes != payload_size(latest.task, cfg):
            self.reads["mismatch"] += 1
        elif prev_ok and latest.task != task - 1:
            self.reads["stale"] += 1


async def _agent_loop(client, agents: Iterator[int], scale: Scale, mixed: bool,
                      payloads: list[bytes], rec: RunRecord, cfg: BenchConfig) -> None:
    for a in agents:  # one iterator shared by all workers: the queue (one thread, no locks)
        agent = f"{cfg.agent_prefix}{a}"
        prev_ok = False
        for j in range(scale.tasks):
            t0 = perf_counter()
            if mixed:
                try:
                    latest = await client.read_latest(agent)
                except CheckpointError as exc:
                    rec.errors[f"read_{exc.label}"] += 1
                    prev_ok = False
                    continue
                t1 = perf_counter()
                rec.check_read(latest, j, prev_ok, cfg)
            else:
                t1 = t0
            try:
                await client.commit(agent, j, payloads[j])
            except CheckpointError as exc:
                rec.errors[f"commit_{exc.label}"] += 1
                prev_ok = False
                continue
            t2 = perf_counter()
            prev_ok = True
            rec.commit_end.append(t2 - rec.t0)
            rec.commit_ms.append((t2 - t1) * 1000)
            rec.task_ms.append((t2 - t0) * 1000)
            if mixed:
                rec.read_ms.append((t1 - t0) * 1000)


def _cpu_secs() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_row(duration: float, client: float, server: float | None, busy: float) -> dict:
    """Where the machine's CPU went during a run, in % of one core. `other` is everything
    that is neither this client nor the known server: load from elsewhere skews the run."""
    def pct(secs: float) -> float:
        return round(100 * secs / duration, 1) if duration > 0 else 0.0

    out = {"client": pct(client), "machine_busy": pct(busy), "cores": os.cpu_count()}
    if server is not None:
        out["server"] = pct(server)
        out["other"] = pct(max(busy - client - server, 0.0))
    return out


def disk_mb(dirs: list) -> float | None:
    """MB of disk blocks allocated under these directories; None without any."""
    if not dirs:
        return None
    total = 0
    for root in dirs:
        for parent, _, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(parent, name)).st_blocks * 512
                except OSError:
                    continue  # went while we looked (a compaction's temporary file)
    return round(total / (1 << 20), 1)


async def run_once(target, clients: list, scale: Scale, mode: str, cfg: BenchConfig,
                   payloads: list[bytes], written: set[tuple[int, int]], run: int = 1) -> dict:
    """One measured run of `scale` × `mode` on already-open worker clients; returns its row."""
    first = max((a for a, _ in written), default=-1) + 1 if cfg.new_agents else 0
    keys = {(a, j) for a in range(first, first + scale.agents) for j in range(scale.tasks)}
    prior = len(keys & written) / len(keys)
    agents = iter(range(first, first + scale.agents))
    pids = getattr(target, "server_pids", [])
    # Our servers' log batches over the run, from /metrics, once every process has published
    # them: a second's pause on each side of the run, for every target alike (a pause lets
    # background work finish: PostgreSQL's as much as ours).
    url = getattr(target, "url", None) if cfg.log_batches else None
    log_path = getattr(target, "log_path", None)
    watch = LogWatch(log_path) if log_path else None
    fsyncs0 = await fsync_window.settled_snapshot(url) if cfg.log_batches else None
    cpu0, server0, busy0 = _cpu_secs(), process_tree_cpu_secs(pids), machine_busy_secs()
    rec = RunRecord(perf_counter())
    await asyncio.gather(*(_agent_loop(c, agents, scale, mode == "mixed", payloads, rec, cfg)
                           for c in clients))
    duration = perf_counter() - rec.t0
    cpu = _cpu_secs() - cpu0
    server = process_tree_cpu_secs(pids) - server0 if pids else None
    busy = machine_busy_secs() - busy0
    log_fsync = fsync_window.delta(fsyncs0, await fsync_window.settled_snapshot(url)) if cfg.log_batches else None
    parts: dict[str, list[float]] = {}
    for client in clients:  # a target may time the parts of its ops (pgredis: each store)
        for name, values in getattr(client, "parts_ms", {}).items():
            parts.setdefault(name, []).extend(values)
            del values[:]
    written |= keys  # a failed commit may have landed anyway: count the key as written
    ok = len(rec.commit_ms)
    anomalies = sum(rec.reads[k] for k in ("lost", "dangling", "mismatch", "stale"))
    return {
        "target": target.name, "scale": scale.name, "mode": mode, "run": run,
        "agents": scale.agents, "tasks": scale.tasks, "workers": len(clients),
        "checkpoints": ok, "attempted": scale.checkpoints,
        "errors": dict(rec.errors), "errors_total": sum(rec.errors.values()),
        "duration_secs": round(duration, 3),
        "checkpoints_per_sec": round(ok / duration, 1) if duration > 0 else None,
        "commit_ms": summarize(rec.commit_ms), "task_ms": summarize(rec.task_ms),
        "read_ms": summarize(rec.read_ms), "reads": dict(rec.reads), "read_anomalies": anomalies,
        "parts_ms": {name: summarize(values) for name, values in parts.items() if values},
        "windows": window_report(rec.commit_end, rec.commit_ms, duration, cfg.window_secs,
                                 cfg.fine_window_secs, cfg.min_windows),
        "prior_keys_fraction": round(prior, 4),
        "phase": "first-insert" if prior == 0 else "overwrite" if prior == 1 else
                 f"partial-overwrite {prior:.0%}",
        "payload_bytes": sum(len(payloads[j]) for j in range(scale.tasks)) * scale.agents,
        "cpu_percent_of_core": _cpu_row(duration, cpu, server, busy),
        "log_fsync": log_fsync,
        "server_log": watch.notable() if watch is not None else None,   # bench/server_log.py
        # what the store holds on disk right after the run (blocks allocated, zeroed segments included)
        "disk_mb": disk_mb(getattr(target, "data_dirs", [])),
    }


async def warm_up(clients: list, cfg: BenchConfig) -> list[str]:
    """One commit and one read per worker on its own warm-up agent: connections are open and
    statements prepared before the first measured op. Returns the errors (not fatal here)."""
    payload = make_payloads(1, cfg)[0]

    async def one(i: int, client) -> str | None:
        try:
            await client.commit(f"bench-warmup-w{i}", 0, payload)
            await client.read_latest(f"bench-warmup-w{i}")
        except CheckpointError as exc:
            return str(exc)
        return None

    return [e for e in await asyncio.gather(*(one(i, c) for i, c in enumerate(clients))) if e]


WARM_BURST_PREFIX = "bench-warmburst-"


async def warm_up_burst(clients: list, cfg: BenchConfig) -> tuple[int, int]:
    """`cfg.warm_up_mb` MB of checkpoints from every worker at once, on agents of their own (the
    payload schedule of a 20-task agent, over and over), then `cfg.warm_up_idle_secs` of rest.
    Every target gets the same; what each store makes of it is its own (our log fills its spare
    segments in the rest, storage/spares.py; PostgreSQL's buffers and WAL have seen the load).
    Returns (bytes committed, errors)."""
    payloads = make_payloads(20, cfg)
    goal = cfg.warm_up_mb << 20
    done = [0, 0]      # bytes committed, errors
    agents = iter(range(1 << 30))

    async def worker(client) -> None:
        while done[0] < goal:
            agent = f"{WARM_BURST_PREFIX}{next(agents)}"
            for task, payload in enumerate(payloads):
                try:
                    await client.commit(agent, task, payload)
                    done[0] += len(payload)
                except CheckpointError:
                    done[1] += 1
                    if done[1] > 100:
                        return       # a target refusing everything: the runs will say so
    if goal:
        await asyncio.gather(*(worker(c) for c in clients))
        await asyncio.sleep(cfg.warm_up_idle_secs)
    return done[0], done[1]


def _forget_op_parts(clients: list) -> None:
    """Drop the timings of each op's parts a target keeps (pgredis: each store): ops outside a
    run are part of none."""
    for client in clients:
        for values in getattr(client, "parts_ms", {}).values():
            del values[:]


async def run_target(target, cfg: BenchConfig, progress: Callable[[str], None] = print,
                     floor_probe: Callable[[], dict] | None = None) -> list[dict]:
    """Every scale × mode × repeat on one target, one connection per worker for all of them.
    With `floor_probe`, the disk's floor is taken again just before each run and kept in its row
    (`disk_floor_p50_ms`): on a disk whose speed drifts by the minute, the run's own floor."""
    scales = [parse_scale(s) for s in cfg.scales]
    payloads = make_payloads(max(s.tasks for s in scales), cfg)
    clients = [await target.open_worker() for _ in range(cfg.workers)]
    written: set[tuple[int, int]] = set()
    rows = []
    try:
        warm_errors = await warm_up(clients, cfg)
        _forget_op_parts(clients)
        if warm_errors:
            progress(f"{target.name}: warm-up errors: {warm_errors[:3]}")
        if cfg.warm_up_mb:
            warm_bytes, warm_failed = await warm_up_burst(clients, cfg)
            _forget_op_parts(clients)
            progress(f"{target.name}: warm-up burst of {warm_bytes / (1 << 20):.1f} MB ({warm_failed} errors), "
                     f"then {cfg.warm_up_idle_secs:g} s of rest")
        for scale in scales:
            for mode in cfg.modes:
                for run in range(1, cfg.repeat + 1):
                    floor = floor_probe() if floor_probe is not None else None
                    row = await run_once(target, clients, scale, mode, cfg, payloads,
                                         written, run)
                    if floor is not None:
                        row["disk_floor_p50_ms"] = floor["p50_ms"]
                    row["warmup_errors"] = len(warm_errors)
                    rows.append(row)
                    progress(_one_line(row))
    finally:
        for client in clients:
            await client.close()
    return rows


def _one_line(r: dict) -> str:
    return (f"{r['target']} {r['scale']} {r['mode']} R{r['run']} ({r['phase']}): "
            f"{r['checkpoints']} ok in {r['duration_secs']} s = {r['checkpoints_per_sec']}/s, "
            f"commit p50 {r['commit_ms']['p50']} p99 {r['commit_ms']['p99']} ms, "
            f"task p99 {r['task_ms']['p99']} ms, errors {r['errors'] or 0}, "
            f"cpu % of a core {r['cpu_percent_of_core']}")
