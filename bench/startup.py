"""Start, restart and stop of the process tree, with the fork server and without it.

`agent-os bench startup [--cycles 5]` alternates trees with `kernel.fork_server` on and off, so
both see the same machine. Per cycle it measures:

- start: seconds from launching `agent-os serve` to `/readyz` answering 200;
- restart: seconds from kill -9 of actor/0 to the next completed turn of a session it owns;
- stop: seconds from SIGTERM to the supervisor's exit;
- idle CPU: the whole tree's CPU while it serves nothing, as % of one core, over `--idle-secs`
  after its first turn (a server that sits waiting should cost next to nothing);
- tree CPU: CPU seconds of the whole tree over the cycle (the supervisor's own and that of every
  descendant it or they waited for, read from this process's rusage once the supervisor exits).
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.checkpoint_targets import process_tree_cpu_secs
from bench.results import ResultsDir, markdown_table, pyplot
from bench.server_proc import ServerProcess, wait_until
from bench.sse_client import sse_events
from broker.sharding import shard_of

METRICS = ("start_secs", "restart_secs", "stop_secs", "tree_cpu_secs", "idle_cpu_pct")
TIMES = METRICS[:4]     # the plot's: seconds
IDLE_SETTLE_SECS = 2.0
CONFIG = {"kernel": {"actors": 2, "drain_secs": 5}, "mock": {"ttft_ms": 10, "tokens": 2}}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _turn(url: str, sid: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.post(f"{url}/v1/sessions/{sid}/turns", json={"input": "hello"}) as resp:
            if resp.status != 200:
                return False
            return any([event == "turn.completed" async for event, _, _ in sse_events(resp)])


def _turn_until_completed(url: str, sid: str, deadline_secs: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_secs
    while True:
        try:
            if asyncio.run(_turn(url, sid)):
                return
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no completed turn for {sid} within {deadline_secs:.0f}s")
        time.sleep(0.02)


def idle_cpu(root_pid: int, secs: float) -> tuple[float, float]:
    """(% of one core over `secs` of doing nothing, CPU seconds of the whole wait with its settling)."""
    start = process_tree_cpu_secs([root_pid])
    time.sleep(IDLE_SETTLE_SECS)
    before = process_tree_cpu_secs([root_pid])
    time.sleep(secs)
    after = process_tree_cpu_secs([root_pid])
    return 100.0 * (after - before) / secs, after - start


def cycle(fork_server: bool, work: Path, idle_secs: float = 10.0) -> dict:
    cpu0 = _children_cpu()
    idle_cpu_secs = 0.0
    server = ServerProcess(work, {**CONFIG, "kernel": {**CONFIG["kernel"], "fork_server": fork_server}})
    began = time.monotonic()
    server.start()
    row = {"fork_server": fork_server, "start_secs": time.monotonic() - began}
    try:
        sid = next(f"startup-{i}" for i in range(1000) if shard_of(f"startup-{i}", 2) == 0)
        _turn_until_completed(server.url, sid)
        row["idle_cpu_pct"], idle_cpu_secs = idle_cpu(server.proc.pid, idle_secs)
        server.remember_pids()
        killed = time.monotonic()
        server.kill9("actor/0")
        _turn_until_completed(server.url, sid)
        row["restart_secs"] = time.monotonic() - killed
        stopping = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: server.proc.poll() is not None, 30, "the supervisor to exit")
        row["stop_secs"] = time.monotonic() - stopping
        row["exit_code"] = server.proc.returncode
    finally:
        server.stop()
    row["tree_cpu_secs"] = _children_cpu() - cpu0 - idle_cpu_secs   # start, restart, stop: not the idle wait
    return row


def summarize(rows: list[dict]) -> tuple[str, dict]:
    medians = {mode: {m: statistics.median(r[m] for r in rows if r["fork_server"] is mode) for m in METRICS}
               for mode in (True, False)}
    table = markdown_table(
        ["measure", "fork server (median)", "python -m agentos.child (median)", "ratio"],
        [(m, round(medians[True][m], 2), round(medians[False][m], 2), round(medians[True][m] / medians[False][m], 2) if medians[False][m] else "–")
         for m in METRICS])
    return table, medians


def plot(medians: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(TIMES))
    ax.bar([x - 0.2 for x in xs], [medians[True][m] for m in TIMES], 0.4, label="fork server")
    ax.bar([x + 0.2 for x in xs], [medians[False][m] for m in TIMES], 0.4, label="python -m agentos.child")
    ax.set_xticks(list(xs), [m.replace("_secs", " (s)").replace("_", " ") for m in TIMES])
    ax.set_ylabel("seconds (median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-os bench startup", description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=5, help="cycles per mode (default: %(default)s)")
    parser.add_argument("--idle-secs", type=float, default=10.0,
                        help="seconds of idle CPU measured per cycle (default: %(default)s)")
    parser.add_argument("--name", default="startup", help="results folder name (default: %(default)s)")
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args(argv)
    results = ResultsDir(args.name, args.results_root)
    results.write_config({"benchmark": "startup", "cycles": args.cycles, "idle_secs": args.idle_secs,
                          "server_config": CONFIG})
    rows = []
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        for i in range(args.cycles):
            for fork_server in ((True, False) if i % 2 == 0 else (False, True)):
                row = {"cycle": i, **cycle(fork_server, Path(tmp) / f"{i}-{int(fork_server)}", args.idle_secs)}
                rows.append(row)
                results.append_row(row)
                print("  " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in row.items()), file=sys.stderr)
    table, medians = summarize(rows)
    plot(medians, results.figure_path("startup.png"))
    results.write_summary(f"# Start, restart and stop of the tree\n\n{args.cycles} cycles per mode, "
                          f"alternating.\n\n{table}\n")
    print(table)
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
