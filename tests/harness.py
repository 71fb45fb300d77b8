"""Test helpers: the real process tree with test defaults, and clients that read turns.

The tree itself is started and stopped by `bench.server_proc.ServerProcess` (shared with the
benchmarks): a private config, a short run directory, port 0, and a stop that checks no process
is left behind.
"""
from __future__ import annotations

import asyncio
import json
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import zygote
from bench.sse_client import sse_events
from bench.server_proc import REPO, ServerError, ServerProcess, cpu_seconds, deep_merge, pid_alive, wait_until  # noqa: F401

TEST_DEFAULTS = {
    "kernel": {"actors": 2, "drain_secs": 10},
    "mock": {"ttft_ms": 50, "tps": 1000, "tokens": 5},
    # Each log's first segment is zeroed at start: 8 MB instead of 64 keeps a test tree's disk small.
    "storage": {"segment_bytes": 8 << 20},
}

_cli_runs = itertools.count()


class Server(ServerProcess):
    def __init__(self, tmp_path: Path, config: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        super().__init__(tmp_path, deep_merge(TEST_DEFAULTS, config or {}), env)

    def launch(self) -> "Server":
        """`agent-os serve`, forked from the test zygote (tests/zygote.py says why) unless it is off."""
        if not zygote.enabled():
            return super().launch()
        args = ["serve", "--config", str(self.config_path), *self.args]
        self.proc = zygote.shared(zygote.SERVE).launch("agentos.cli", args, cwd=self.cwd, env=self.env,
                                                       log=self.log_path)
        return self

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """`agent-os ARGS --config …`, its output captured, forked from the test zygote unless it is off."""
        if not zygote.enabled():
            return super().cli(*args, timeout=timeout)
        command = [*args, "--config", str(self.config_path)]
        out, err = (self.work_dir / f"cli-{os.getpid()}-{next(_cli_runs)}.{name}" for name in ("out", "err"))
        try:
            proc = zygote.shared().launch("agentos.cli", command, cwd=REPO, env=self.env, log=out, stderr=err,
                                          safe_path=False)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def status(self, memory: bool = False) -> dict[str, Any]:
        """What `agent-os status --json` prints, gathered in this process as that command does
        (over the real bus): for tests that poll it. The command itself is an interpreter's
        start and imports, a quarter second of CPU a poll in a CPU-bound suite; its own output
        is tested where it is the point. Without each process's memory unless asked: no poll
        reads it, and reading it was most of a poll's CPU (about 70 ms a poll, 6 ms without)."""
        from agentos import config as config_mod
        from agentos.status import collect
        return json.loads(json.dumps(collect(config_mod.load(self.config_path, environ=self.env), memory=memory)))


class Worker:
    """`agent-os worker flows_app` (or `module`, of tests/) against a server, as its own process (group)."""

    def __init__(self, server: ServerProcess, slots: int = 16, env: dict[str, str] | None = None,
                 module: str = "flows_app", args: tuple[str, ...] = ()) -> None:
        self.server = server
        self.log_path = server.work_dir / f"worker-{id(self):x}.log"
        args = ["worker", module, "--slots", str(slots), "--config", str(server.config_path), *args]
        self.proc = launch_python("agentos.cli", args, Path(__file__).parent,
                                  dict(os.environ, PYTHONPATH=str(REPO), **(env or {})), self.log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_registered(self, timeout: float = 20.0) -> "Worker":
        wait_until(lambda: b"slots; flows" in self.log_path.read_bytes() or self.proc.poll() is not None, timeout,
                   "the worker to start")
        if self.proc.poll() is not None:
            raise ServerError(f"worker exited:\n{self.log_path.read_text()[-3000:]}")
        # The line is logged as the worker's hello leaves: a turn started before the scheduler has
        # it would find none of the worker's tools advertised.
        wait_until(lambda: self._known() or self.proc.poll() is not None, timeout, "the scheduler to know the worker",
                   interval=0.2)
        return self

    def _known(self) -> bool:
        for process in self.server.status().get("processes", []):
            if process.get("name") == "scheduler":
                names = (process.get("stats") or {}).get("tasks", {}).get("worker_names", [])
                return any(name.endswith(f"-{self.proc.pid}") for name in names)
        return False

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(5)
            except Exception:
                continue


def launch_python(module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path):
    """`python -m MODULE ARGS` in `cwd` (on its path), in a session of its own, stdout and stderr
    appended to `log`: forked from the test zygote unless it is off, then a subprocess."""
    if zygote.enabled():
        return zygote.shared().launch(module, args, cwd=cwd, env=env, log=log, safe_path=False)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


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
    async for event, body, ident in sse_events(resp):
        result.events.append((event, body))
        if ident is not None:
            result.ids.append(ident)
        if on_event is not None:
            await on_event(event, result)


async def run_turn(session: aiohttp.ClientSession, base: str, sid: str, text: str, headers=None,
                   on_event=None, timeout: float = 30.0, system: str | None = None) -> TurnResult:
    body = {"input": text, **({"system": system} if system is not None else {})}
    async with session.post(f"{base}/v1/sessions/{sid}/turns", json=body, headers=headers,
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


async def start_turn(session: aiohttp.ClientSession, base: str, sid: str, text: str, headers=None,
                     timeout: float = 30.0) -> asyncio.Task:
    """A turn running in a task, returned once its `turn.started` came (await the task for the
    rest of it); for tests that act on a turn while it runs."""
    started = asyncio.Event()

    async def on_event(name, result):
        if name == "turn.started":
            started.set()

    task = asyncio.create_task(run_turn(session, base, sid, text, headers=headers, on_event=on_event,
                                        timeout=timeout))
    waiting = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiting}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if not started.is_set():
        if task.done():
            result = task.result()
            raise AssertionError(f"turn on {sid} ended before it started: status {result.status}, "
                                 f"error {result.error}, events {[e for e, _ in result.events]}")
        task.cancel()
        raise AssertionError(f"turn on {sid} did not start within 10 s")
    return task


def turn(base: str, sid: str, text: str, **kwargs) -> TurnResult:
    async def go():
        async with aiohttp.ClientSession() as session:
            return await run_turn(session, base, sid, text, **kwargs)
    return asyncio.run(go())


def finished_transcript(base: str, sid: str, timeout: float = 30.0) -> list[dict]:
    """The session's transcript once it ends with the model's answer (a turn finishing in the
    background, after its actor's restart)."""
    def finished():
        messages = get_json(f"{base}/v1/sessions/{sid}/messages")[2].get("messages")
        return messages if messages and messages[-1]["role"] == "assistant" and messages[-1]["content"] else None
    return wait_until(finished, timeout, f"the turn on {sid} to finish", interval=0.2)


def turn_killing_its_actor(server, sid: str, text: str, gate: Path, actors: int = 2,
                           system: str | None = None) -> TurnResult:
    """Run a turn whose tools are get_weather and search (run at once), and kill -9 the session's
    actor once the weather's result is in (its step is committed, the search step running). The
    search returns only once `gate` exists (its worker's FLOWS_APP_TOOL_GATE), created after the kill."""
    from broker.sharding import actor_name

    async def go():
        async def on_event(name, result):
            last = result.events[-1][1]
            if name == "tool" and last["phase"] == "result" and last["name"] == "get_weather":
                await asyncio.get_running_loop().run_in_executor(None, server.kill9, actor_name(sid, actors))
                gate.touch()

        async with aiohttp.ClientSession() as s:
            return await run_turn(s, server.url, sid, f"{text} [[mock tool_calls=get_weather,search ttft_ms=20]]",
                                  on_event=on_event, timeout=60, system=system)
    return asyncio.run(go())


def get_json(url: str, method: str = "GET", body: bytes | None = None, headers=None) -> tuple[int, dict, dict]:
    import urllib.error
    import urllib.parse
    import urllib.request
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    # A read that asks the server to hold it (`?wait=N`) is given N s more than any other: with 10 s
    # flat, a `wait=10` poll timed out on the client just as the server answered.
    wait = float(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("wait", ["0"])[0])
    try:
        with urllib.request.urlopen(req, timeout=10 + wait) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, dict(exc.headers), json.loads(raw) if raw else {}


def status_of(url: str, headers=None) -> int:
    """The status of a GET whatever its body (read, so the connection is closed, not left to GC)."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        with exc:
            exc.read()
        return exc.code


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
