"""`python -m bench.peer_opencode --check`: opencode against the mock, measured, in one command.

Owns: starting the mock model as a child process for the check, the check's load points and its
printed table (turn time, the time opencode adds over the mock's own, throughput, the mock's
streams open at once, memory of opencode's tree idle and at peak). Never does: write result
folders or plots (the `bench turns --peer opencode` driver does).

    python -m bench.peer_opencode --check                          # c=1 for 10 s
    python -m bench.peer_opencode --concurrency 1,8,32,128 --duration 15 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.loadgen import LoadConfig, run
from bench.mock_proc import MockModel
from bench.sampling import PeakMemory
from bench.peer_opencode import (
    OPENCODE_VERSION, TARGET_OPTIONS, InstallError, OpencodeServer, PeerError, ensure_opencode,
    tree_cpu_secs, tree_memory_kib, warm_up_load,
)

EXIT_OK = 0
EXIT_FAILED = 1
SETTLE_QUIET_SECS = 2.0
SETTLE_TIMEOUT_SECS = 180.0
POLL_SECS = 0.05


def settle(peer: OpencodeServer, mock: MockModel) -> int:
    """Until opencode is idle and the mock saw no new request for the quiet period: the tail of
    the last point (turns whose client left) must not run into the next one."""
    busy, deadline = 0, time.monotonic() + SETTLE_TIMEOUT_SECS
    while time.monotonic() < deadline:
        busy = max(busy, peer.wait_idle())
        before = mock.stats()
        time.sleep(SETTLE_QUIET_SECS)
        after = mock.stats()
        if after["current"] == 0 and after["requests"] == before["requests"]:
            return busy
    raise PeerError(f"opencode kept calling the mock for {SETTLE_TIMEOUT_SECS:g}s after a point")


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"  # None: no ok turn in the window


def run_points(args: argparse.Namespace) -> list[dict]:
    binary = ensure_opencode()
    rows = []
    with MockModel(args.ttft_ms, args.tps, args.tokens) as mock, \
            OpencodeServer(binary, tools=args.tools) as peer:
        t0 = time.monotonic()
        url = peer.start(mock.url)
        idle = tree_memory_kib(peer.pids())
        print(f"opencode {OPENCODE_VERSION} at {url} (ready after one turn in "
              f"{time.monotonic() - t0:.1f}s), mock at {mock.url}, mock turn "
              f"{mock.ideal_turn_ms:.0f} ms; idle: rss {_mib(idle['rss_kib'])} MiB, "
              f"private dirty {_mib(idle['private_dirty_kib'])} MiB, {len(peer.pids())} process(es)")
        if args.jit_warmup > 0:
            warm = warm_up_load(url, args.jit_warmup)
            print(f"JIT warm-up: {args.jit_warmup:g}s at c=32, {warm['counts']['ok']} turns, "
                  f"{warm['turns_per_sec']} turns/s")
        print(f"{'c':>5} {'turns/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'+p50 ms':>8} {'ok':>6} {'errors':>6} {'mock max':>8} {'cpu/turn':>8} "
              f"{'peak rss':>9} {'peak dirty':>10} {'load':>5}")
        for concurrency in args.concurrency:
            busy = settle(peer, mock)
            mock.reset_stats()
            cfg = LoadConfig(url=url, concurrency=concurrency, duration_secs=args.duration,
                             warmup_secs=args.warmup, target="opencode",
                             target_options=dict(TARGET_OPTIONS),
                             session_prefix=f"peer-c{concurrency}")
            cpu0 = tree_cpu_secs(peer.pids())
            with PeakMemory(peer.pids) as peak:
                report = run(cfg)
            cpu_secs = tree_cpu_secs(peer.pids()) - cpu0
            turn, counts = report["turn_ms"], report["counts"]
            errors = sum(n for kind, n in counts.items() if kind != "ok")
            added = turn["p50"] - mock.ideal_turn_ms if turn["n"] else None
            mock_stats = mock.stats()
            cpu_ms_per_turn = 1000 * cpu_secs / max(mock_stats["completed"], 1)
            row = {"concurrency": concurrency, "turns_per_sec": report["turns_per_sec"],
                   "turn_ms": turn, "added_p50_ms": None if added is None else round(added, 1), "counts": counts,
                   "error_samples": report["error_samples"], "mock": mock_stats,
                   "opencode_cpu_ms_per_turn": round(cpu_ms_per_turn, 1),
                   "load_avg_1m": round(os.getloadavg()[0], 2),
                   "memory_idle_kib": idle, "memory_peak_kib": dict(peak.peak),
                   "memory_after_kib": tree_memory_kib(peer.pids()), "busy_before": busy}
            rows.append(row)
            print(f"{concurrency:>5} {report['turns_per_sec']:>8.2f} {_ms(turn['p50']):>8} "
                  f"{_ms(turn['p95']):>8} {_ms(turn['p99']):>8} {_ms(added):>8} "
                  f"{counts['ok']:>6} {errors:>6} {mock_stats['max_concurrent']:>8} "
                  f"{cpu_ms_per_turn:>5.0f} ms {_mib(peak.peak['rss_kib']):>5} MiB "
                  f"{_mib(peak.peak['private_dirty_kib']):>6} MiB {row['load_avg_1m']:>5.1f}")
            for sample in report["error_samples"][:3]:
                print(f"      error: {sample['kind']} {sample['message']}")
    return rows


def _concurrency_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of integers >= 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_opencode",
                                     description="opencode serve against the mock model, measured")
    parser.add_argument("--check", action="store_true",
                        help="one turn stream at concurrency 1 (the default points)")
    parser.add_argument("--concurrency", type=_concurrency_list,
                        help="comma-separated load points (default with --check: 1)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before each window")
    parser.add_argument("--jit-warmup", type=float, default=20.0,
                        help="seconds of unmeasured load at c=32 first (0: none)")
    parser.add_argument("--ttft-ms", type=int, default=2000)
    parser.add_argument("--tps", type=float, default=200.0)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--tools", action="store_true",
                        help="send opencode's tool set in every request (default: none)")
    parser.add_argument("--json", metavar="PATH", help="write one row per point here")
    args = parser.parse_args(argv)
    if not args.check and args.concurrency is None:
        parser.print_help()
        return EXIT_OK
    args.concurrency = args.concurrency or [1]
    try:
        rows = run_points(args)
    except (PeerError, InstallError) as exc:
        print(f"peer_opencode: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    failed = any(row["counts"]["ok"] == 0 for row in rows)
    return EXIT_FAILED if failed else EXIT_OK
