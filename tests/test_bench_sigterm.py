"""A benchmark stopped with SIGTERM stops what it started: the server tree (in a session of its own,
so nothing else would), the mock model and the load generator."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmdline)
    return out


def tree_of(root: int, table: dict[int, tuple[int, str]]) -> set[int]:
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _) in table.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def test_sigterm_to_a_benchmark_stops_the_server_it_started(tmp_path):
    # The turn sweep: a mock model and a server tree, and no signal handling of its own.
    bench = subprocess.Popen([sys.executable, "-m", "agentos.cli", "bench", "turns", "--sweep", "4",
                              "--duration", "60", "--profiles", "core", "--memory", "", "--no-overload",
                              "--mock-ttft-ms", "50", "--results-root", str(tmp_path / "results")],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:   # the mock, the server tree and the load generator are up
            table = processes()
            server = tree_of(bench.pid, table) - {bench.pid}
            if any("loadgen" in table[pid][1] for pid in server) and any("gateway" in table[pid][1] for pid in server):
                break
            time.sleep(0.3)
        assert len(server) >= 6, "the benchmark's server and load did not start"
        time.sleep(1.0)   # the load is running
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server & set(processes()):
            time.sleep(0.2)
        assert not server & set(processes()), "server processes outlived the benchmark"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in server & set(processes()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
