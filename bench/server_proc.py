"""Run a real Agent OS process tree as a subprocess: for benchmarks and end-to-end tests.

Each instance gets its own YAML config, a short private run directory (ipc:// paths must stay
short) and port 0, read back from the run directory. `stop()` sends SIGTERM, then kills the
process groups of everything the tree started, and waits until none of it is left.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from agentos import module_command
from broker import spill

REPO = Path(__file__).resolve().parents[1]


class ServerError(RuntimeError):
    pass


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


MAX_PAUSE = 0.2


def wait_until(predicate, timeout: float, what: str, interval: float | None = None):
    """`predicate()` until it is true. Without an `interval`, asked every 20 ms at first and less
    often the longer it takes, up to every 200 ms: most predicates are HTTP requests that cost
    CPU in the asker and in two or three processes of the tree."""
    deadline = time.monotonic() + timeout
    pause = interval or 0.02
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.25, MAX_PAUSE)


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    def __init__(self, work_dir: Path, config: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 remove_work_dir: bool = False) -> None:
        self.work_dir = Path(work_dir)
        self.remove_work_dir = remove_work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.run_root = Path(tempfile.mkdtemp(prefix="aos-", dir="/tmp"))
        base = {
            "gateway": {"listen": "127.0.0.1:0"},
            # the gateway on the last CPU, not the one its supervisor would claim: trees started one
            # after another, or side by side while another is loaded, get the same placement
            "kernel": {"run_dir": str(self.run_root / "run"), "gateway_cpu": max(os.sched_getaffinity(0))},
            "storage": {"dir": str(self.work_dir / "data")},
        }
        self.config = deep_merge(base, config or {})
        self.config_path = self.work_dir / f"agent-os-{id(self):x}.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.log_path = self.work_dir / f"server-{id(self):x}.log"
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()
        self._log = None
        self.args: tuple[str, ...] = ()   # extra `agent-os serve` arguments, e.g. ("--standby",)
        self.cwd = REPO                   # where `agent-os serve` is started

    @classmethod
    def temporary(cls, prefix: str, config: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                  tmp_root: str | None = None) -> "ServerProcess":
        """A tree in a fresh directory that goes once the tree is stopped: a benchmark's data is
        gigabytes (10k checkpoints leave about 1 GB, 100k about 12 GB) that nobody reads again."""
        return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_root)), config, env, remove_work_dir=True)

    # -- lifecycle ------------------------------------------------------------------------

    def launch(self) -> "ServerProcess":
        """Start the supervisor without waiting for it to serve (a standby waits for the lease)."""
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(module_command("agentos.cli", "serve", "--config", str(self.config_path),
                                                    *self.args),
                                     cwd=self.cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.port is None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_until(ready, timeout, "the server to be ready", interval=0.05)
        self.remember_pids()

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then kill whatever is left; returns the supervisor's exit code."""
        if self.proc is None:
            return None
        self.remember_pids()
        code = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        else:
            code = self.proc.returncode
        self.kill_all()
        return code

    def crash(self) -> None:
        """SIGKILL to the supervisor and every process of its tree at once, as a machine or
        container dies: nothing gets to flush, hand over or release its lease."""
        self.remember_pids()
        for pid in [self.proc.pid, *self.seen_pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        if self._log is not None:   # a later start() opens it again
            self._log.close()
            self._log = None

    def kill_all(self) -> None:
        for pid in [self.proc.pid, *self.seen_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        wait_until(lambda: not [p for p in self.seen_pids if pid_alive(p)], 10, "all server processes to exit")
        if self._log is not None:
            self._log.close()
            self._log = None
        spill.remove_leftovers(f"ipc://{self.rundir}/broker.sock")   # a tree killed at once removes none of its rings
        shutil.rmtree(self.run_root, ignore_errors=True)
        if self.remove_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        return [p for p in self.seen_pids | {self.proc.pid} if pid_alive(p)]

    def log(self) -> str:
        """The tree's whole log: a check that a line is there, or that none is an ERROR, reads all
        of it (a tail of 6,000 characters lost the line a test looked for once more followed)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 6000) -> str:
        """The log's end, for a message."""
        return self.log()[-chars:]

    # -- the tree -------------------------------------------------------------------------

    @property
    def rundir(self) -> Path:
        return self.run_root / "run"

    @property
    def port(self) -> int | None:
        try:
            return int((self.rundir / "gateway.port").read_text())
        except (OSError, ValueError):
            return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mock_url(self) -> str:
        return f"http://127.0.0.1:{int((self.rundir / 'mock-llm.port').read_text())}"

    def table(self) -> dict:
        return json.loads((self.rundir / "processes.json").read_text())

    def pid(self, name: str) -> int | None:
        for row in self.table()["children"]:
            if row["name"] == name:
                return row["pid"]
        raise KeyError(name)

    def pids(self) -> dict[str, int]:
        """Every live process of the tree by name, the supervisor included."""
        table = self.table()
        out = {"supervisor": table["supervisor"]["pid"]}
        if (table.get("forkserver") or {}).get("pid"):
            out["forkserver"] = table["forkserver"]["pid"]
        out.update({r["name"]: r["pid"] for r in table["children"] if r["pid"]})
        return out

    def restarts(self, name: str) -> int:
        return next(r["restarts"] for r in self.table()["children"] if r["name"] == name)

    def remember_pids(self) -> None:
        try:
            table = self.table()
        except (OSError, ValueError):
            return
        self.seen_pids.update(r["pid"] for r in table["children"] if r["pid"])
        if (table.get("forkserver") or {}).get("pid"):
            self.seen_pids.add(table["forkserver"]["pid"])

    def kill9(self, name: str, timeout: float = 20.0) -> None:
        """kill -9 one process and wait until the supervisor has restarted it."""
        old = self.pid(name)
        self.remember_pids()
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (self.pid(name) or old) != old, timeout, f"{name} to be restarted")
        self.remember_pids()

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agentos.cli", *args, "--config", str(self.config_path)],
                              cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)
