"""Start and stop the real process tree for end-to-end tests.

Every server gets its own config, a short private run directory (ipc:// paths must stay short)
and port 0 read back from the run directory. `stop()` terminates, then kills the process groups,
and checks that no process of the tree is left behind.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

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


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


class Server:
    def __init__(self, tmp_path: Path, config: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.tmp_path = tmp_path
        self.run_dir = Path(tempfile.mkdtemp(prefix="aos-", dir="/tmp"))
        base = {
            "gateway": {"listen": "127.0.0.1:0"},
            "kernel": {"run_dir": str(self.run_dir / "run"), "actors": 2, "drain_secs": 10},
            "storage": {"dir": str(tmp_path / "data")},
            "mock": {"ttft_ms": 50, "tps": 1000, "tokens": 5},
        }
        self.config = deep_merge(base, config or {})
        self.config_path = tmp_path / f"agent-os-{id(self):x}.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.log_path = tmp_path / f"server-{id(self):x}.log"
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "Server":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "agentos.cli", "serve", "--config", str(self.config_path)],
                                     cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.wait_ready(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            port = self.port
            if port is None:
                return False
            try:
                import urllib.request
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_until(ready, timeout, "the server to be ready", interval=0.05)
        self.remember_pids()

    def stop(self, timeout: float = 20.0) -> int | None:
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
        self._log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        return [p for p in self.seen_pids | {self.proc.pid} if pid_alive(p)]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    # -- the tree -------------------------------------------------------------------------

    @property
    def rundir(self) -> Path:
        return self.run_dir / "run"

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

    def restarts(self, name: str) -> int:
        return next(r["restarts"] for r in self.table()["children"] if r["name"] == name)

    def remember_pids(self) -> None:
        try:
            table = self.table()
        except (OSError, ValueError):
            return
        self.seen_pids.update(r["pid"] for r in table["children"] if r["pid"])

    def kill9(self, name: str, timeout: float = 20.0) -> None:
        """kill -9 one process and wait until the supervisor has restarted it and it is live again."""
        old = self.pid(name)
        self.remember_pids()
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (self.pid(name) or old) != old, timeout, f"{name} to be restarted")
        self.remember_pids()

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agentos.cli", *args, "--config", str(self.config_path)],
                              cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)


# -- clients ------------------------------------------------------------------------------

@dataclass
class TurnResult:
    status: int
    headers: dict[str, str]
    events: list[tuple[str, dict]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    error: dict | None = None
    broken: bool = False

    @property
    def text(self) -> str:
        return "".join(d["text"] for e, d in self.events if e == "delta")

    @property
    def terminal(self) -> str | None:
        last = self.events[-1][0] if self.events else None
        return last if last in ("turn.completed", "turn.failed", "turn.cancelled") else None

    def data(self, event: str) -> dict:
        return next(d for e, d in self.events if e == event)


async def read_sse(resp: aiohttp.ClientResponse, result: TurnResult, on_event=None) -> None:
    event, data, ident = "message", [], None
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                result.events.append((event, json.loads("\n".join(data))))
                if ident is not None:
                    result.ids.append(int(ident))
                if on_event is not None:
                    await on_event(event, result)
            event, data, ident = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            ident = value


async def run_turn(session: aiohttp.ClientSession, base: str, sid: str, text: str, headers=None,
                   on_event=None, timeout: float = 30.0) -> TurnResult:
    async with session.post(f"{base}/v1/sessions/{sid}/turns", json={"input": text}, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        result = TurnResult(resp.status, dict(resp.headers))
        if resp.status != 200:
            result.error = (await resp.json())["error"]
            return result
        try:
            await read_sse(resp, result, on_event)
        except aiohttp.ClientPayloadError:
            result.broken = True
        return result


def turn(base: str, sid: str, text: str, **kwargs) -> TurnResult:
    async def go():
        async with aiohttp.ClientSession() as session:
            return await run_turn(session, base, sid, text, **kwargs)
    return asyncio.run(go())


def get_json(url: str, method: str = "GET", body: bytes | None = None, headers=None) -> tuple[int, dict, dict]:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, dict(exc.headers), json.loads(raw) if raw else {}


def metric_values(text: str) -> dict[str, float]:
    """name{labels} -> value, parsed with prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def scrape(base: str) -> dict[str, float]:
    import urllib.request
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        return metric_values(resp.read().decode())
