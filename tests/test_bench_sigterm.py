"""A benchmark stopped with SIGTERM stops what it started: the server tree (in a session of its own,
so nothing else would), the mock model and the load generator, and the flow workers it was still
starting."""
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


def test_workers_a_benchmark_was_still_starting_when_stopped_are_stopped(tmp_path, monkeypatch):
    """SIGTERM came while `bench chaos` waited for its worker to come up: the benchmark never got
    the worker's handle to stop it, and a worker outlives its server (it waits for it to return)."""
    from bench import step_workers

    class NoServer:   # a worker waits for a bus that never answers, as it would for a dead server
        work_dir = tmp_path
        config_path = tmp_path / "agent-os.yaml"

    NoServer.config_path.write_text(f"kernel:\n  run_dir: {tmp_path / 'run'}\n")
    spawned: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            spawned.append(self)

    def sigterm(*_):
        raise SystemExit(143)   # what the benchmarks' SIGTERM handler does

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    previous = signal.signal(signal.SIGALRM, sigterm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.8)   # within its wait for the workers to come up
        try:
            step_workers.start_workers(NoServer, 2, 4)
        except SystemExit as exc:
            assert exc.code == 143
        else:
            raise AssertionError("start_workers was not interrupted")
        assert len(spawned) == 2 and all(proc.poll() is not None for proc in spawned), \
            [proc.pid for proc in spawned if proc.poll() is None]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for proc in spawned:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
