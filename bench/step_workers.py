"""The flow workers a benchmark runs against its server tree (`agent-os worker bench.steps_app`),
each in a session of its own: started, and stopped however the benchmark ends."""
from __future__ import annotations

import os
import sys
import time

from bench.server_proc import REPO, ServerProcess


def start_workers(server: ServerProcess, count: int, slots: int) -> list:
    """`count` workers of bench.steps_app, each in a session of its own. Interrupted on the way
    (SIGTERM to the benchmark unwinds as SystemExit), it stops those it started: its caller
    never got them to stop, and a worker outlives its server, waiting for it to come back."""
    import subprocess
    procs = []
    try:
        for i in range(count):
            with open(server.work_dir / f"worker-{i}.log", "ab") as log:   # (the worker has its own copy)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "agentos.cli", "worker", "bench.steps_app", "--slots", str(slots),
                     "--config", str(server.config_path), "--name", f"worker/bench-{i}"],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(2.0)
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited: see {server.work_dir}")
    except BaseException:
        stop_workers(procs)
        raise
    return procs


def stop_workers(procs: list) -> None:
    """SIGTERM to each worker's session, SIGKILL to one still there 10 s later."""
    import signal
    import subprocess
    for proc in procs:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
                proc.wait(10)
            except subprocess.TimeoutExpired:
                continue
            except OSError:   # (ProcessLookupError: its session is gone already)
                break
