"""`agent-os bench turns`: the turn sweep, idle-session memory, overload, and peers side by side.

For each server profile (`core`: storage.durability none; `persist`: the full write path), a
process tree runs against one mock model (TTFT 2000 ms, 200 tok/s, 8 tokens by default) with the
admission gate off and `concurrency_limit` above the largest point; the profiles' trees stand side
by side and take turns point by point (`--repeat N`: N rounds of each point). Each point runs the closed-loop
load generator in its own process, samples the server tree's CPU and memory, and reads the mock's
`/stats` (max_concurrent proves the provider limit held). Then: memory of an idle tree and its
increment per idle session (1,000 and 10,000 sessions), an overload point with the gate on, and,
with `--peer opencode`, the same sweep against `opencode serve` on the same mock.
Everything lands in `bench/results/<date>-<name>/`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import yaml

from bench.checkpoint_compare import override
from bench.results import ResultsDir
from bench.sampling import PeakMemory, named_pids, window_between, window_sample
from bench.server_log import LogWatch
from bench.server_proc import REPO, ServerProcess, deep_merge
from bench.turns_report import write_report

DEFAULT_SWEEP = "1,2,4,8,16,32,64,128,256,512,1000"
FAST_MARKER = " [[mock ttft_ms=1 tps=10000]]"


def bench_config(profile: str, mock_url: str, max_concurrency: int, actors: int) -> dict[str, Any]:
    """A profile's server config. `profile` is `core` or `persist`, optionally followed by config
    keys of its own: `persist:storage.commit_window_us=0` runs beside `persist` as a third tree."""
    base, _, settings = profile.partition(":")
    if base not in ("core", "persist"):
        raise ValueError(f"unknown profile {profile!r}: core or persist, then optionally :key=value;key=value")
    config: dict[str, Any] = {
        "provider": {"base_url": f"{mock_url}/v1"},
        "kernel": {"max_in_flight_turns": 0, "concurrency_limit": max(64, max_concurrency + 64), "actors": actors,
                   "session_ttl_secs": 3600},
        "storage": {"durability": "none" if base == "core" else "local"},
    }
    for setting in filter(None, settings.split(";")):
        key, sep, raw = setting.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"profile {profile!r}: key=value expected, got {setting!r}")
        config = deep_merge(config, override(key.strip(), yaml.safe_load(raw)))   # values read as YAML, as in a config file
    return config


def _slug(profile: str) -> str:
    """A profile as a file name and session-id prefix."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", profile)


def http_json(method: str, url: str) -> Any:
    import urllib.request
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as resp:
        return json.loads(resp.read())


class Progress:
    """One line per point on stderr, redrawn each second: what runs and how far it is."""

    def __init__(self, label: str, total_secs: float) -> None:
        self.label, self.total = label, total_secs
        self.started = time.monotonic()

    def tick(self) -> None:
        done = min(self.total, time.monotonic() - self.started)
        filled = int(20 * done / self.total) if self.total else 20
        sys.stderr.write(f"\r  {self.label:<28} [{'#' * filled}{'.' * (20 - filled)}] {done:4.0f}/{self.total:.0f}s")
        sys.stderr.flush()

    def done(self, summary: str) -> None:
        sys.stderr.write(f"\r  {self.label:<28} {summary:<60}\n")
        sys.stderr.flush()


def run_loadgen(url: str, concurrency: int, duration: float, warmup: float, prefix: str, out: Path,
                pids_fn, label: str, extra: list[str] | None = None, input_text: str = "Say something.") -> dict:
    """One point: the load generator in its own process; the server's CPU and memory sampled
    meanwhile, and over the measured window each of its processes' CPU, the whole machine's, and
    (our tree) the log's batch fdatasyncs. `pids_fn` gives the tree's pids, or {name: pid}."""
    cmd = [sys.executable, "-m", "bench.loadgen", "--url", url, "--concurrency", str(concurrency),
           "--duration", str(duration), "--warmup", str(warmup), "--session-prefix", prefix,
           "--input", input_text, "--json", str(out), *(extra or [])]
    progress = Progress(label, warmup + duration)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = last = None
    started = time.monotonic()
    try:
        with PeakMemory(lambda: named_pids(pids_fn).values()) as memory:
            while proc.poll() is None:
                elapsed = time.monotonic() - started
                if first is None and elapsed >= warmup:
                    first = window_sample(url, pids_fn, out.parent)
                if last is None and elapsed >= warmup + duration:
                    last = window_sample(url, pids_fn, out.parent)
                progress.tick()
                time.sleep(0.25)
    finally:
        if proc.poll() is None:   # interrupted (SIGTERM, ^C): the load stops with us
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
    if last is None:
        last = window_sample(url, pids_fn, out.parent)
    result = json.loads(out.read_text())
    result.update(window_between(first, last))
    result["server_memory_peak_kib"] = memory.peak
    result["server_memory_kib"] = memory.last
    counts = result["counts"]
    progress.done(f"{result['turns_per_sec']:.1f} turns/s  p50 {result['turn_ms'].get('p50') or 0:.0f} ms  "
                  f"ok {counts['ok']} err {sum(v for k, v in counts.items() if k != 'ok')}")
    return result


def point_row(kind: str, concurrency: int, result: dict, mock_stats: dict | None) -> dict:
    counts = result["counts"]
    return {
        "profile": kind, "concurrency": concurrency, "turns_per_sec": result["turns_per_sec"],
        "ttft_ms": result["ttft_ms"], "turn_ms": result["turn_ms"], "counts": counts,
        "http_error_by_status": result.get("http_error_by_status", {}),
        "rejected_latency_ms": result.get("rejected_latency_ms"),
        "mock_max_concurrent": (mock_stats or {}).get("max_concurrent"),
        "server_cpu_percent": result.get("server_cpu_percent"),
        "loadgen_cpu_percent": result["loadgen_cpu"]["cpu_percent_of_one_core"],
        "loadgen_cpu_ms_per_turn": result["loadgen_cpu"]["cpu_ms_per_turn"],
        "server_private_dirty_kib": result["server_memory_peak_kib"]["private_dirty_kib"],
        "server_rss_kib": result["server_memory_peak_kib"]["rss_kib"],
        "error_samples": result.get("error_samples", [])[:3],
        "server_cpu_by_process": result.get("server_cpu_by_process"),
        "machine_busy_percent": result.get("machine_busy_percent"),
        "server_written_mb_by_process": result.get("server_written_mb_by_process"),
        "disk": result.get("disk"),
        "log_fsync": result.get("log_fsync"),
    }


# -- the mock on its own: the baseline every added latency is measured against ---------------

async def _mock_direct(url: str, turns: int) -> dict:
    ttft, total = [], []
    body = {"model": "mock", "stream": True, "messages": [{"role": "user", "content": "Say something."}]}
    async with aiohttp.ClientSession() as session:
        for _ in range(turns):
            started = time.perf_counter()
            first = None
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                async for line in resp.content:
                    if first is None and line.startswith(b"data:") and b'"content":"' in line and \
                            b'"content":""' not in line:
                        first = time.perf_counter()
            ttft.append((first - started) * 1000.0)
            total.append((time.perf_counter() - started) * 1000.0)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"profile": "mock-direct", "concurrency": 1, "turns": turns, "ttft_ms": {"p50": median(ttft)},
            "turn_ms": {"p50": median(total)}}


def mock_direct(url: str, turns: int = 20) -> dict:
    return asyncio.run(_mock_direct(url, turns))


# -- memory of idle sessions ----------------------------------------------------------------

async def _open_sessions(url: str, prefix: str, start: int, count: int, concurrency: int = 200) -> int:
    """One short turn on each of `count` new sessions; returns how many completed."""
    ok = 0
    queue = iter(range(start, start + count))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker():
            nonlocal ok
            for i in queue:
                async with session.post(f"{url}/v1/sessions/{prefix}-{i}/turns",
                                        json={"input": "remember me" + FAST_MARKER}) as resp:
                    text = await resp.text()
                    ok += resp.status == 200 and "turn.completed" in text
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def measure_memory(server: ServerProcess, counts: list[int], settle_secs: float, label: str) -> list[dict]:
    """Private memory of the tree idle, then with N idle sessions resident (turn buffers expired)."""
    def private_kib() -> int:
        from agentos.status import tree_memory
        return tree_memory(list(server.pids().values()))["private_dirty_kib"]

    rows = []
    time.sleep(2.0)
    idle = private_kib()
    rows.append({"profile": label, "kind": "memory", "sessions": 0, "private_dirty_kib": idle})
    opened = 0
    for target in counts:
        progress = Progress(f"{label} memory {target} sessions", settle_secs)
        done = asyncio.run(_open_sessions(server.url, f"mem-{label}", opened, target - opened))
        opened = target
        deadline = time.monotonic() + settle_secs  # finished turns leave memory after their retention
        while time.monotonic() < deadline:
            progress.tick()
            time.sleep(0.5)
        now = private_kib()
        status = json.loads(server.cli("status", "--json").stdout)
        row = {"profile": label, "kind": "memory", "sessions": target, "opened_ok": done,
               "active_sessions": status.get("active_sessions"), "private_dirty_kib": now,
               "per_session_kib": round((now - idle) / target, 2)}
        rows.append(row)
        progress.done(f"{now / 1024:.1f} MiB private, {row['per_session_kib']:.1f} KiB per idle session")
    return rows


# -- overload ---------------------------------------------------------------------------------

def overload(work: Path, mock, args, pids_label: str = "overload") -> dict:
    """The gate on (max_in_flight_turns 8, concurrency_limit 3) at concurrency 64."""
    config = bench_config("persist", mock.url, 3, args.actors)
    config["kernel"].update({"max_in_flight_turns": 8, "concurrency_limit": 3})
    server = ServerProcess(work / "overload", config).start()
    try:
        mock.reset_stats()
        result = run_loadgen(server.url, 64, args.duration, args.warmup, "overload", work / "overload.json",
                             server.pids, "overload c=64 gate 8/3")
        stopped = time.monotonic()
        recovery = _recovery_secs(server.url, stopped)
        row = point_row("overload", 64, result, mock.stats())
        row.update({"kind": "overload", "max_in_flight_turns": 8, "concurrency_limit": 3,
                    "recovery_secs": recovery})
        return row
    finally:
        server.stop()


def _recovery_secs(url: str, since: float, timeout: float = 60.0) -> float | None:
    """Seconds from the end of the load until a new turn is accepted and completes."""
    async def probe() -> bool:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/sessions/recovery/turns", json={"input": "hello"}) as resp:
                return resp.status == 200 and "turn.completed" in await resp.text()
    while time.monotonic() - since < timeout:
        if asyncio.run(probe()):
            return round(time.monotonic() - since, 2)
        time.sleep(0.1)
    return None


# -- the command ------------------------------------------------------------------------------

def run_sweep(profiles: list[str], sweep: list[int], mock, args, work: Path, keep: Callable[[dict], None]) -> None:
    """Every point against a server of each profile. The servers stand side by side (an idle one
    costs next to nothing) and, at each concurrency, each round runs every profile in turn, the
    order reversed every other time, so the machine's drift over the command falls on each
    profile alike (on this shared machine it moved turns/s by a fifth within minutes)."""
    servers: dict[str, ServerProcess] = {}
    turn = 0
    try:
        for profile in profiles:
            servers[profile] = ServerProcess(work / _slug(profile),
                                             bench_config(profile, mock.url, max(sweep), args.actors)).start()
        for c in sweep:
            for rnd in range(1, args.repeat + 1):
                for profile in (profiles if turn % 2 == 0 else profiles[::-1]):
                    server = servers[profile]
                    label = profile if args.repeat == 1 else f"{profile} round {rnd}"
                    mock.reset_stats()
                    watch = LogWatch(server.log_path)
                    result = run_loadgen(server.url, c, args.duration, args.warmup, f"{_slug(profile)}-{rnd}-c{c}",
                                         work / f"{_slug(profile)}-{rnd}-{c}.json", server.pids,
                                         f"{label} c={c}")
                    keep({**point_row(profile, c, result, mock.stats()), "round": rnd,
                          "server_log": watch.notable()})   # bench/server_log.py
                turn += 1
    finally:
        for server in servers.values():
            server.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent-os bench turns", description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default=DEFAULT_SWEEP, help="concurrency points, comma-separated")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per point")
    p.add_argument("--profiles", default="core,persist",
                   help="server profiles: core, persist, and either with keys of its own "
                        "(persist:storage.commit_window_us=0)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of every point, each running the profiles in the reverse order of the one before")
    p.add_argument("--peer", default="", help="also run the sweep against a peer: opencode")
    p.add_argument("--peer-sweep", default="", help="points for the peer (default: --sweep)")
    p.add_argument("--mock-ttft-ms", type=float, default=2000.0)
    p.add_argument("--mock-tps", type=float, default=200.0)
    p.add_argument("--mock-tokens", type=int, default=8)
    p.add_argument("--memory", default="1000,10000", help="idle sessions for the memory points ('' = skip)")
    p.add_argument("--memory-settle", type=float, default=35.0, help="wait for turn buffers to expire, seconds")
    p.add_argument("--no-overload", action="store_true", help="skip the overload point")
    p.add_argument("--keep-work", action="store_true",
                   help="keep the servers' data directories and logs (their path is printed) to look into a run")
    p.add_argument("--actors", type=int, default=0, help="kernel.actors (0 = one per core)")
    p.add_argument("--name", default="turns", help="results folder: bench/results/<date>-<name>")
    p.add_argument("--results-root", default=None, help="where results folders go (default bench/results)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.mock_proc import MockModel

    args = parse_args(argv)
    sweep = [int(x) for x in args.sweep.split(",") if x]
    profiles = [p for p in args.profiles.split(",") if p]
    for profile in profiles:
        try:
            bench_config(profile, "", 0, 0)
        except ValueError as exc:
            raise SystemExit(f"agent-os bench turns: {exc}") from None
    results = ResultsDir(args.name, Path(args.results_root) if args.results_root else None)
    results.write_config({"command": "bench turns", "args": vars(args), "sweep": sweep})
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        results.append_row(row)

    (results.path / "rows.jsonl").unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    try:
        with MockModel(args.mock_ttft_ms, args.mock_tps, args.mock_tokens) as mock:
            print(f"mock model at {mock.url} (ttft {args.mock_ttft_ms:g} ms, {args.mock_tps:g} tok/s, "
                  f"{args.mock_tokens} tokens); results in {results.path}", file=sys.stderr)
            keep(mock_direct(mock.url))
            run_sweep(profiles, sweep, mock, args, work, keep)
            for profile in profiles:
                if args.memory:
                    server = ServerProcess(work / f"{_slug(profile)}-memory",
                                           bench_config(profile, mock.url, 1000, args.actors)).start()
                    try:
                        for row in measure_memory(server, [int(x) for x in args.memory.split(",")],
                                                  args.memory_settle, _slug(profile)):
                            keep(row)
                    finally:
                        server.stop()
            if not args.no_overload:
                keep(overload(work, mock, args))
            if args.peer:
                from bench.peer_sweep import run_peer
                peer_sweep = [int(x) for x in (args.peer_sweep or args.sweep).split(",") if x]
                for row in run_peer(args.peer, mock, peer_sweep, args, work):
                    keep(row)
    finally:
        if args.keep_work:
            print(f"servers' data and logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)   # servers' data and load logs: read already
    write_report(results, rows, args)
    print(f"results: {results.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
