"""Checkpoint writes: agents × tasks, a durable checkpoint after every step, on each target.

Owns: the run over targets × scales × modes, the command line and the results folder (config,
rows, summary, plot). The workload and its runner live in `bench.checkpoint_workload`, the
targets in `bench.checkpoint_targets`, the window maths, table and plot in
`bench.checkpoint_report`, the reference stack in `bench.peer_pgredis`, LangGraph's Postgres
checkpointer in `bench.peer_langgraph`, the disk floor in `bench.disk_floor`. Without
`--agentos-url` it starts our server itself (a fresh process tree on the same disk, `--durability
local` or `s3` against moto's S3 on loopback), so one command measures every stack.

Each target runs inside its own context (the pgredis and langgraph ones start a private stack
before their runs and stop it after, also on errors and on SIGTERM) on a fresh uvloop loop; the
disk floor is measured once, first, in the directory where the peer's data goes.

    python -m bench.checkpoints --scales 1k,10k --modes write,mixed --workers 10 \
        --targets agentos,pgredis --agentos-url http://127.0.0.1:8080

`--compare KEY=V1,V2 --rounds N` runs our server instead under each value of one config key,
side by side, a fresh tree per value and round (bench/checkpoint_compare.py).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import signal
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from bench.checkpoint_compare import arm_name, override, parse_compare
from bench.checkpoint_report import COLUMNS, plot_windows, summary_markdown, table_rows
from bench.checkpoint_targets import LAYER_TARGETS, TARGETS, AgentOSTarget, PgRedisTarget
from bench.checkpoint_workload import BenchConfig, run_target
from bench.peer_langgraph import langgraph_started
from bench.results import ResultsDir, markdown_table
from bench.server_proc import deep_merge

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM: the stacks were stopped, no results were written


# ----------------------------------------------------------------------------------- targets
@contextlib.contextmanager
def pgredis_target(cfg: BenchConfig, tmp_root: str | None, appendfsync: str) -> Iterator:
    """A private PostgreSQL + Redis for the lifetime of the block (stopped even on errors)."""
    from bench.peer_pgredis import ReferenceStack

    with ReferenceStack(tmp_root, redis_appendfsync=appendfsync) as stack:
        yield PgRedisTarget(stack.pg_dsn, stack.redis_url, cfg.op_timeout_secs, stack.info,
                            server_pids=stack.pids())


@contextlib.contextmanager
def agentos_started(cfg: BenchConfig, tmp_root: str, durability: str, name: str = "agentos",
                    overrides: dict | None = None, round_: int | None = None) -> Iterator:
    """Our server for the lifetime of the block: a fresh tree in `tmp_root` (the peer's disk).
    `round_`: which round of a `--compare` run this tree serves (its rows say so)."""
    from bench.server_proc import ServerProcess

    config: dict = deep_merge({"storage": {"durability": durability}, "mock": {"ttft_ms": 10}}, overrides or {})
    env, s3 = None, None
    if durability == "s3":
        from bench.s3_local import CREDENTIALS, S3Server
        s3 = S3Server()
        config.update(s3.storage_config(s3.new_bucket(), direct=True))
        config["cluster"] = {}
        env = CREDENTIALS
    server = ServerProcess.temporary("bench-ckpt-", config, env, tmp_root)
    try:
        server.start()
        target = AgentOSTarget(server.url, cfg.op_timeout_secs, None, server_pids=list(server.pids().values()),
                               name=name)
        target.data_dirs = [server.config["storage"]["dir"]]
        target.log_path = str(server.log_path)   # each run's row keeps its warnings (bench/server_log.py)
        target.round = round_
        yield target
    finally:
        server.stop()
        if s3 is not None:
            s3.stop()


@contextlib.contextmanager
def noop_started(cfg: BenchConfig, durable_under: str | None = None) -> Iterator:
    """bench/noop_http.py in a process of its own for the lifetime of the block; with
    `durable_under`, its group-committing mode (`fsync-http`) in a scratch dir made there."""
    log_dir = tempfile.mkdtemp(prefix="bench-fsync-http-", dir=durable_under) if durable_under else None
    proc = subprocess.Popen([sys.executable, "-m", "bench.noop_http", *(["--log-dir", log_dir] if log_dir else [])],
                            cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"bench.noop_http did not start: {line!r}")
        yield AgentOSTarget(line.split()[-1], cfg.op_timeout_secs, None, server_pids=[proc.pid],
                            name="fsync-http" if log_dir else "noop-http")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


def run_benchmark(cfg: BenchConfig, targets: list[Callable[[], AbstractContextManager]],
                  progress: Callable[[str], None] = print,
                  floor_probe: Callable[[], dict] | None = None) -> tuple[list[dict], dict]:
    """Run every target (each a factory of a context manager yielding a target object) on a
    fresh uvloop loop; returns the rows and each target's description."""
    import uvloop  # only here: importing the module must not pick the caller's loop

    cfg.validate()
    rows: list[dict] = []
    described: dict[str, dict] = {}
    for factory in targets:
        with factory() as target:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                new = runner.run(run_target(target, cfg, progress, floor_probe))
            if getattr(target, "round", None) is not None:
                for row in new:
                    row["round"] = target.round
            rows += new
            described[target.name] = target.describe()
    return rows, described


def write_results(rows: list[dict], config: dict, root: Path | None = None,
                  name: str = "checkpoints") -> Path:
    out = ResultsDir(name, root)
    out.write_config(config)
    out.write_rows(rows)
    out.write_summary(summary_markdown(rows, config))
    if rows:
        plot_windows(rows, out.figure_path("windowed_commit_p99.png"))
    return out.path


# --------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="python -m bench.checkpoints",
                                description=__doc__.split("\n")[0])
    p.add_argument("--scales", default=",".join(d.scales), help="1k,10k,100k or AxT")
    p.add_argument("--modes", default=",".join(d.modes), help="write,mixed")
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--repeat", type=int, default=d.repeat, help="runs per scale × mode")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"of {', '.join(TARGETS + LAYER_TARGETS)} (default: %(default)s)")
    p.add_argument("--agentos-url", help="our running server (default: start one for the run)")
    p.add_argument("--durability", choices=("local", "s3"), default="local",
                   help="storage.durability of the server this run starts")
    p.add_argument("--agentos-api-key")
    p.add_argument("--agentos-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key of the server this run starts, e.g. storage.compaction_interval_secs=5 "
                        "(repeatable; the value is YAML)")
    p.add_argument("--compare", metavar="KEY=V1,V2",
                   help="instead of --targets: our server with each value of one config key, side by "
                        "side, a fresh tree per value and round (e.g. storage.commit_window_us=0,2000)")
    p.add_argument("--rounds", type=int, default=3, help="with --compare: rounds of alternating trees")
    p.add_argument("--agentos-pid", type=int, action="append", default=[],
                   help="our server's top process: its tree's CPU is reported (repeatable)")
    p.add_argument("--op-timeout", type=float, default=d.op_timeout_secs, dest="op_timeout_secs")
    p.add_argument("--redis-appendfsync", choices=("everysec", "always"), default="everysec")
    p.add_argument("--peer-tmp", default=tempfile.gettempdir(),
                   help="where the private PostgreSQL/Redis data dir goes (default: %(default)s)")
    p.add_argument("--floor-dir", help="directory of the disk floor (default: --peer-tmp)")
    p.add_argument("--floor-iterations", type=int, default=2000, help="0 skips the disk floor")
    p.add_argument("--no-log-batches", action="store_true",
                   help="skip reading our log's batch histogram around each run (it waits a second each side)")
    p.add_argument("--warm-up-mb", type=int, default=d.warm_up_mb, metavar="MB",
                   help="before its first run each target takes this many MB of checkpoints (not measured) "
                        "and rests --warm-up-idle seconds: a store that has been running (default: 0, none)")
    p.add_argument("--warm-up-idle", type=float, default=d.warm_up_idle_secs, dest="warm_up_idle_secs",
                   metavar="SECS")
    p.add_argument("--new-agents", action="store_true",
                   help="every run on agents no earlier run used, so each is a first insert (sessions that "
                        "come and go) rather than the article's overwrite of the same keys")
    p.add_argument("--floor-each-run", type=int, default=0, metavar="N",
                   help="also take the first floor size, N appends, just before every run, and report "
                        "each run's commit p50 against it (0: only before and after all runs)")
    p.add_argument("--floor-bytes", default="4096",
                   help="append sizes of the disk floor, comma-separated; the first is the one the "
                        "target is stated against (default: %(default)s)")
    p.add_argument("--cpu-latency-us", type=int,
                   help="hold idle CPUs to this wakeup latency for the whole run, every target alike "
                        "(/dev/cpu_dma_latency; 0 keeps them polling; default: leave the machine be)")
    p.add_argument("--results-root", type=Path, help="default: bench/results")
    p.add_argument("--results-name", default="checkpoints")
    return p


def _overrides(pairs: list[str]) -> dict:
    """`a.b=value` pairs as a nested config dict (values parsed as YAML)."""
    import yaml

    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--agentos-set: KEY=VALUE expected, got {pair!r}")
        out = deep_merge(out, override(key.strip(), yaml.safe_load(value)))
    return out


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _masked(argv: list[str]) -> list[str]:
    """The command line for config.json, without the API key."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--agentos-api-key" and i + 1 < len(out):
            out[i + 1] = "***"
        elif arg.startswith("--agentos-api-key="):
            out[i] = "--agentos-api-key=***"
    return out


def main(argv: list[str] | None = None) -> int:
    # SIGTERM acts as Ctrl-C: KeyboardInterrupt unwinds through every `with`, so the private
    # PostgreSQL and Redis are stopped (a sweep driver's timeout must not orphan them).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cfg = BenchConfig(scales=_csv(args.scales), modes=_csv(args.modes), workers=args.workers,
                      repeat=args.repeat, op_timeout_secs=args.op_timeout_secs, log_batches=not args.no_log_batches,
                      warm_up_mb=args.warm_up_mb, warm_up_idle_secs=args.warm_up_idle_secs,
                      new_agents=args.new_agents)
    try:
        cfg.validate()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        overrides = _overrides(args.agentos_set)
    except ValueError as exc:
        parser.error(str(exc))
    factories: list[Callable[[], AbstractContextManager]] = []
    compare = None
    if args.compare:
        try:
            key, values = parse_compare(args.compare)
        except ValueError as exc:
            parser.error(str(exc))
        if args.agentos_url or args.rounds < 1:
            parser.error("--compare starts its own trees (no --agentos-url) for --rounds >= 1")
        compare = {"key": key, "values": [raw for raw, _ in values], "rounds": args.rounds}
        for r in range(1, args.rounds + 1):
            # A B, B A, A B, …: a tree that runs first (or second) in its round gains or loses alike
            for raw, value in values if r % 2 else values[::-1]:
                factories.append(lambda raw=raw, value=value, r=r: agentos_started(
                    cfg, args.peer_tmp, args.durability, arm_name(key, raw),
                    deep_merge(overrides, override(key, value)), round_=r))
    for name in () if compare else _csv(args.targets):
        if name not in TARGETS + LAYER_TARGETS:
            parser.error(f"unknown target {name!r}; known: {TARGETS + LAYER_TARGETS}")
        if name == "noop-http":
            factories.append(lambda: noop_started(cfg))
        elif name == "fsync-http":
            factories.append(lambda: noop_started(cfg, durable_under=args.peer_tmp))
        elif name == "agentos-none":
            factories.append(lambda: agentos_started(cfg, args.peer_tmp, "none", "agentos-none", overrides))
        elif name == "agentos":
            if not args.agentos_url:
                factories.append(lambda: agentos_started(cfg, args.peer_tmp, args.durability, overrides=overrides))
                continue
            target = AgentOSTarget(args.agentos_url, cfg.op_timeout_secs, args.agentos_api_key,
                                   server_pids=args.agentos_pid)
            factories.append(lambda t=target: contextlib.nullcontext(t))
        elif name == "langgraph":
            factories.append(lambda: langgraph_started(args.peer_tmp, cfg.op_timeout_secs))
        else:
            factories.append(lambda: pgredis_target(cfg, args.peer_tmp, args.redis_appendfsync))
    if not factories:
        parser.error("no target to run")
    from bench.cpu_idle import idle_latency_limit, wakeup_round_trip
    from bench.cpu_speed import python_workload
    from bench.disk_floor import device_of, fsync_floor

    floor_dir = args.floor_dir or args.peer_tmp
    try:
        floor_sizes = [int(x) for x in _csv(args.floor_bytes)]
    except ValueError:
        parser.error("--floor-bytes: comma-separated byte counts")
    started_at = datetime.datetime.now().isoformat(timespec="seconds")   # the results are written at the end
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(idle_latency_limit(args.cpu_latency_us))
        except (ValueError, RuntimeError) as exc:
            parser.error(f"--cpu-latency-us: {exc}")
        wakeup = wakeup_round_trip()
        print(f"wakeup round trip between two processes: p50 {wakeup['p50_us']} µs, p99 {wakeup['p99_us']} µs")
        cpu = python_workload()
        print(f"fixed Python workload: {cpu['p50_us']} µs per iteration (fastest trial {cpu['min_us']})")
        floors = [fsync_floor(floor_dir, args.floor_iterations, size) for size in floor_sizes] \
            if args.floor_iterations > 0 else []
        for floor in floors:
            print(f"disk floor in {floor_dir} ({floor['block_bytes']} B): p50 {floor['p50_ms']} ms, "
                  f"p99 {floor['p99_ms']} ms")
        probe = (functools.partial(fsync_floor, floor_dir, args.floor_each_run, floor_sizes[0])
                 if args.floor_each_run > 0 else None)
        rows, described = run_benchmark(cfg, factories, floor_probe=probe)
        # the first size again: the disk's speed drifts by the minute here, and a floor taken only
        # before the runs can be far from the one they met
        floor_after = fsync_floor(floor_dir, args.floor_iterations, floor_sizes[0]) if floors else None
        if floor_after is not None:
            print(f"disk floor after the runs ({floor_after['block_bytes']} B): p50 {floor_after['p50_ms']} ms")
    floor = floors[0] if floors else None
    bench_dev, peer_dev = device_of(Path(__file__).parent), device_of(args.peer_tmp)
    config = {"started_at": started_at, "finished_at": datetime.datetime.now().isoformat(timespec="seconds"),
              "bench": dataclasses.asdict(cfg), "targets": described, "agentos_config": overrides,
              "compare": compare,
              "disk_floor": floor,
              "disk_floors": floors,
              "disk_floor_after": floor_after,
              "floor_each_run": ({"n": args.floor_each_run, "block_bytes": floor_sizes[0]}
                                 if args.floor_each_run > 0 else None),
              "cpu_latency_us": args.cpu_latency_us,
              "wakeup_round_trip": wakeup,
              "python_workload": cpu,
              "devices": {"bench_dir": bench_dev, "peer_tmp": peer_dev,
                          "same_device": bench_dev["st_dev"] == peer_dev["st_dev"]},
              "argv": _masked(sys.argv[1:] if argv is None else argv)}
    path = write_results(rows, config, args.results_root, args.results_name)
    print(markdown_table(COLUMNS, table_rows(rows, cfg.repeat)))
    print(f"results: {path}")
    return EXIT_OK


if __name__ == "__main__":
    try:  # here, not in main(): a caller such as a test keeps its own process title
        import setproctitle
        setproctitle.setproctitle("agent-os: bench-checkpoints")
    except ImportError:  # the title is a convenience, not a requirement
        pass
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: servers stopped, no results written", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
