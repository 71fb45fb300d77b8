"""The `agent-os` command line. Commands are listed in one table, `COMMANDS`."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from agentos import config as config_mod
from agentos import native_memory, service
from agentos.rundir import RunDir
from storage.records import RecordKind


def _load(args: argparse.Namespace) -> config_mod.Config:
    try:
        return config_mod.load(args.config)
    except config_mod.ConfigError as exc:
        print(f"agent-os: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(service.EXIT_CONFIG) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from agentos import rundir

    config = _load(args)
    run_dir = RunDir.for_config(config)
    try:
        rundir.claim(run_dir)
    except (rundir.RunDirBusy, config_mod.ConfigError, OSError) as exc:
        print(f"agent-os: {exc}", file=sys.stderr)
        return service.EXIT_CONFIG
    # prometheus-client picks its multiprocess mode when first imported: set it up before that.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir.metrics_dir)
    import uvloop

    from agentos.supervisor import Supervisor

    service.set_title("supervisor")
    log = service.setup_logging("supervisor")
    before, after = service.raise_open_files_limit()
    if after != before:
        log.info("open files limit raised from %d to %d (each client connection takes one)", before, after)
    try:
        return uvloop.run(Supervisor(config, run_dir, standby=args.standby).run())
    finally:
        rundir.release(run_dir)


def cmd_status(args: argparse.Namespace) -> int:
    from agentos import status

    return status.main(_load(args), as_json=args.json)


def cmd_trace(args: argparse.Namespace) -> int:
    from agentos import trace

    return trace.main(_load(args), session=args.session, kind=args.kind, turn=args.turn, count=args.count,
                      timeout_secs=args.timeout)


def cmd_worker(args: argparse.Namespace) -> int:
    from actors import worker_process

    config = _load(args)
    log = service.setup_logging("worker")
    return worker_process.main(config, args.modules, args.slots, args.name, log, args.drain)


def cmd_keys(args: argparse.Namespace) -> int:
    from broker.address import keys_dir, make_keys

    config = _load(args)
    directory = Path(args.dir) if args.dir else keys_dir(config)
    made = make_keys(directory, ["client", *args.client])
    for path in made:
        print(f"created {path}")
    print(f"keys in {directory}: give remote workers server.key and their own NAME.key_secret "
          f"(agent-os keys --client NAME), with broker.client_key: NAME; set broker.transport: tcp")
    return 0


BENCHMARKS = {
    "turns": "bench.turns",
    "loadgen": "bench.loadgen",
    "checkpoints": "bench.checkpoints",
    "steps": "bench.steps",
    "chaos": "bench.chaos",
    "soak": "bench.soak",
    "startup": "bench.startup",
    "failover": "bench.failover",
    "queue-places": "bench.queue_places",
    "broadcasts": "bench.broadcasts",
}


def cmd_log(args: argparse.Namespace) -> int:
    from storage import log_inspect

    wal_root = Path(args.data_dir or _load(args).storage.dir) / "wal"
    if args.action == "check" and args.bucket:
        return _check_bucket(_load(args))
    if args.action == "check":
        return log_inspect.print_check(wal_root)
    if args.action == "mend":
        config = _load(args)
        config.storage.dir = str(wal_root.parent)    # the run directory held is that data directory's
        return _mend_logs(config, wal_root)
    return log_inspect.print_dump(wal_root, args.log, args.start, args.kind, args.session, args.limit)


def _check_bucket(config) -> int:
    from storage import bucket_check
    from storage.s3 import ObjectStore, S3Unavailable

    if not config.storage.s3.bucket:
        print("agent-os log check --bucket reads the bucket's copy of the logs: it needs storage.s3 in the config",
              file=sys.stderr)
        return 2
    try:
        return bucket_check.print_check(ObjectStore(config.storage.s3), sys.stdout)
    except S3Unavailable as exc:
        print(f"the bucket is out of reach: {exc}", file=sys.stderr)
        return 2


def _mend_logs(config, wal_root: Path) -> int:
    """`agent-os log mend`: with the server stopped (its run directory held meanwhile, so none
    starts): a running server's own readers mend what they read."""
    from agentos.rundir import RunDir, RunDirBusy, claim, release
    from storage import bucket_mending
    from storage.s3 import ObjectStore, S3Unavailable

    if not config.storage.s3.bucket:
        print("agent-os log mend takes the bucket's copy of the log: it needs storage.s3 in the config",
              file=sys.stderr)
        return 2
    run_dir = RunDir.for_config(config)
    try:
        claim(run_dir)
    except RunDirBusy as exc:
        print(f"{exc}: stop it first (while it runs, its own readers mend the damage they meet)", file=sys.stderr)
        return 2
    try:
        return bucket_mending.mend_all(wal_root, ObjectStore(config.storage.s3), sys.stdout)
    except S3Unavailable as exc:
        print(f"the bucket is out of reach: {exc}", file=sys.stderr)
        return 2
    finally:
        release(run_dir)


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib
    import signal

    # SIGTERM unwinds like Ctrl-C: the benchmark's `finally` blocks stop the server trees and peers
    # it started (in sessions of their own, so nothing else would), instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # With glibc's defaults a load generator with 32 replies of 160 KiB alive at once handed the
    # heap's top back whenever they were all freed and faulted it in again: 2,500 brk calls and
    # 114k page faults a second, its whole core (bench/results/2026-12-04-spill-*).
    native_memory.keep_freed_heap(256 << 20)
    return importlib.import_module(BENCHMARKS[args.which]).main(args.rest)


def cmd_mock_llm(args: argparse.Namespace) -> int:
    from bench import mock_llm

    return mock_llm.main(args.rest)


def _drain_secs(text: str) -> float:
    try:
        secs = float(text)
    except ValueError:
        secs = -1.0
    if not 0 <= secs < float("inf"):   # (NaN too)
        raise argparse.ArgumentTypeError(f"--drain takes seconds, 0 or more: {text!r}")
    return secs


def _with_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML config file (env AGENTOS_<SECTION>_<KEY> overrides)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-os", description="Agent OS: durable LLM agent server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server (supervisor and its process tree)")
    _with_config(serve)
    serve.add_argument("--standby", action="store_true",
                       help="watch the cluster lease (storage.s3) and take over when the active node's expires")
    serve.set_defaults(func=cmd_serve)
    status = sub.add_parser("status", help="live process table, memory, queues, in-flight turns")
    _with_config(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    trace = sub.add_parser("trace", help="watch messages flow through the broker")
    _with_config(trace)
    trace.add_argument("--session", help="only this session")
    trace.add_argument("--turn", help="only this turn")
    trace.add_argument("--kind", help="only kinds starting with this (e.g. turn. or permit.grant)")
    trace.add_argument("--count", type=int, default=0, help="exit after this many lines")
    trace.add_argument("--timeout", type=float, default=0.0, help="exit after this many seconds")
    trace.set_defaults(func=cmd_trace)
    keys = sub.add_parser("keys", help="CURVE key pairs for broker.transport: tcp")
    _with_config(keys)
    keys.add_argument("--dir", help="where (default: broker.keys_dir, else <storage.dir>/keys)")
    keys.add_argument("--client", action="append", default=[], help="also a key pair for this client name")
    keys.set_defaults(func=cmd_keys)
    worker = sub.add_parser("worker", help="run user flows, tools and update handlers (MODULE or MODULE:APP)")
    _with_config(worker)
    worker.add_argument("modules", nargs="+", help="modules defining an actors.sdk.App (attribute `app`)")
    worker.add_argument("--slots", type=int, default=64, help="tasks run at once (default 64)")
    worker.add_argument("--name", default=None, help="bus name (default worker/HOST-PID)")
    worker.add_argument("--drain", type=_drain_secs, default=0.0, metavar="SECS",
                        help="on SIGTERM or Ctrl-C take no new task and give those running up to SECS to end "
                             "before cutting them short (default 0: at once; a second signal: at once)")
    worker.set_defaults(func=cmd_worker)
    inspect = sub.add_parser("log", help="check, dump or mend the write-ahead logs of a data directory")
    _with_config(inspect)
    inspect.add_argument("action", choices=("check", "dump", "mend"),
                         help="check: every record whole (exit 1 if not); dump: a JSON line per record; "
                              "mend: write the bucket's copy over damaged records (storage.s3; the server stopped)")
    inspect.add_argument("--data-dir", help="the data directory (default: storage.dir of the config)")
    inspect.add_argument("--bucket", action="store_true",
                         help="check: the bucket's copy of the logs instead (storage.s3): every object read back "
                              "whole, no gap in any log (exit 1 if not); it only reads, so it may run beside the server")
    inspect.add_argument("--log", help="dump: only this log (a directory name under wal/)")
    inspect.add_argument("--from", dest="start", type=int, default=0, help="dump: from this log position")
    inspect.add_argument("--kind", action="append", default=[], choices=[k.name for k in RecordKind],
                         help="dump: only records of this kind (repeatable)")
    inspect.add_argument("--session", help="dump: only this session's records, or this run's journal "
                                           "(ids as the server names them: tenant~id for a tenant's)")
    inspect.add_argument("--limit", type=int, default=0, help="dump: at most this many records")
    inspect.set_defaults(func=cmd_log)
    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHMARKS) + " (--help after the name)")
    bench.add_argument("which", choices=sorted(BENCHMARKS))
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(func=cmd_bench)
    mock = sub.add_parser("mock-llm", help="run the OpenAI-compatible mock model (bench/mock_llm.py)")
    mock.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the mock (--port, --port-file)")
    mock.set_defaults(func=cmd_mock_llm)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = None
    try:
        code = args.func(args) or 0
        sys.stdout.flush()   # here, not at exit: a reader that left is then an error we can see
        return code
    except BrokenPipeError:
        if not reader_gone(sys.stdout.fileno()):
            raise
        # `agent-os log dump | head`: the reader has what it wanted. Python would print a
        # traceback, and another as it flushed stdout at exit: stdout goes nowhere instead. The
        # code is the command's if it had ended, else what a shell shows for a program SIGPIPE
        # ended (as `cat` would be).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code if code is not None else 128 + signal.SIGPIPE


def reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket whose reading end is closed (poll says POLLERR)."""
    import select
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
