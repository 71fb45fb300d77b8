"""opencode's server as a benchmark peer: run it against our mock, measure it, stop it.

Owns: one `opencode serve` process tree per run, in its own process group and a private temp
folder; its readiness check, warm-up, idle wait and stop; the memory of its tree. The pinned
install is bench/opencode_install.py; what opencode is told (config file, environment) is
bench/opencode_config.py; the self-check CLI is bench/peer_opencode_check.py. Never does: sweeps into result folders or plots (the
`bench turns --peer opencode` driver does), and never touches the user's home: opencode's config,
data (its SQLite database), state, cache and temp files all live in the run's temp folder, which
is deleted on stop, so every run starts clean.

API (stable; the sweep driver uses exactly this):

    binary = ensure_opencode()            # npm install once (bench/.cache/opencode), then fast
    with OpencodeServer(binary) as peer:
        url = peer.start("http://127.0.0.1:MOCK_PORT")   # answers, provider checked, one turn
        warm_up_load(url)                 # 20 s unmeasured at c=32: lets Bun's JIT settle
        peer.wait_idle()                  # before each point: the last one's turns have ended
        report = loadgen.run(LoadConfig(url=url, target="opencode",
                                         target_options=TARGET_OPTIONS, concurrency=…))
        tree_memory_kib(peer.pids())      # {"rss_kib", "private_dirty_kib", "private_kib", "pss_kib"}
    # leaving the block stops the whole tree and raises PeerError if any process survives

A fresh server pays ~1–5 s of lazy set-up on its first turn (project instance, tool registry,
watchers); `start()` spends it on one warm-up turn so that measured turns never see it. Its JIT
then needs a few hundred turns to settle, which `warm_up_load` provides.

Self-check: `python -m bench.peer_opencode --check` starts the mock (TTFT 2000 ms, 200 tok/s,
8 tokens) and opencode, runs loadgen's opencode target at concurrency 1 for 10 s and prints the
turn time and memory; `--concurrency 1,8,32,128 --duration 15` runs a small sweep instead.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from bench.opencode_config import MODEL_ID, PROVIDER_ID, config_json, config_path, peer_env, private_dirs
from bench.opencode_install import OPENCODE_VERSION, InstallError, ensure_opencode, installed_binary

__all__ = ["OPENCODE_VERSION", "TARGET_OPTIONS", "InstallError", "OpencodeServer", "PeerError",
           "ensure_opencode", "installed_binary", "process_tree", "tree_cpu_secs", "tree_memory_kib",
           "warm_up_load"]

TARGET_OPTIONS = {"provider_id": PROVIDER_ID, "model_id": MODEL_ID}  # loadgen's opencode target
WARM_UP_LOAD_SECS = 20.0
WARM_UP_LOAD_CONCURRENCY = 32
START_TIMEOUT_SECS = 60.0
TURN_TIMEOUT_SECS = 60.0
STOP_GRACE_SECS = 5.0
KILL_WAIT_SECS = 5.0
POLL_SECS = 0.05
IDLE_POLL_SECS = 0.2
IDLE_QUIET_SECS = 2.0
LOG_TAIL_BYTES = 4000
LISTENING = b"opencode server listening on "  # printed once the port is bound


class PeerError(RuntimeError):
    """opencode could not be started, warmed up or stopped cleanly."""


# ------------------------------------------------------------------------------ process tree
def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and ")"


def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """(ppid, pgid, state, start time in ticks) of a process, None if it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def _all_stats() -> dict[int, tuple[int, int, str, int]]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            stats[int(entry)] = st
    return stats


def process_tree(root_pid: int) -> list[int]:
    """`root_pid` and its live descendants, root first; empty if `root_pid` is gone."""
    stats = _all_stats()
    if root_pid not in stats or stats[root_pid][2] == "Z":
        return []
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st[0], []).append(pid)
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo.extend(p for p in children.get(pid, ()) if stats[p][2] != "Z")
    return tree


def check_starting(children: dict[str, subprocess.Popen | None], deadline: float, what: str,
                   timeout_secs: float, log_tail: Callable[[], str],
                   error: type[Exception]) -> None:
    """Raise `error` (with the log tail) if a child died or the deadline passed while starting."""
    for name, proc in children.items():
        if proc is not None and proc.poll() is not None:
            raise error(f"{name} exited with {proc.returncode} before it could {what}{log_tail()}")
    if time.monotonic() >= deadline:
        raise error(f"{' and '.join(children)} did not {what} within {timeout_secs:g}s{log_tail()}")


def tree_memory_kib(pids: list[int]) -> dict[str, int]:
    """Summed KiB of `pids` from /proc/PID/smaps_rollup: rss, private_dirty, private, pss."""
    from agentos.status import tree_memory  # the project's one smaps_rollup reader

    return tree_memory(pids)


def tree_cpu_secs(pids: list[int]) -> float:
    """User + system CPU seconds the live `pids` have used so far (/proc/PID/stat)."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def warm_up_load(url: str, secs: float = WARM_UP_LOAD_SECS,
                 concurrency: int = WARM_UP_LOAD_CONCURRENCY) -> dict:
    """Unmeasured load through loadgen's opencode target until opencode's JIT has settled.

    opencode runs on Bun (JavaScriptCore): a fresh server spends ~2x more CPU per turn than one
    that has served a few hundred turns (measured here: 230 ms of CPU per turn in the first 10 s
    at c=8, ~100 ms after 50 s). Run this once after start() and before the first measured point.
    Returns loadgen's report of the warm-up (its sessions stay open in opencode, as real ones do).
    """
    from bench.loadgen import LoadConfig, run

    return run(LoadConfig(url=url, concurrency=concurrency, duration_secs=secs, warmup_secs=2.0,
                          target="opencode", target_options=dict(TARGET_OPTIONS),
                          session_prefix="jit-warm-up"))


# ------------------------------------------------------------------------------------ server
def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
    """One small JSON request (readiness, warm-up); the load itself goes through loadgen."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def listening_url(log: bytes) -> str | None:
    """The base URL opencode printed once it listens, or None before that."""
    start = log.find(LISTENING)
    if start < 0:
        return None
    rest = log[start + len(LISTENING):]
    end = rest.find(b"\n")
    if end < 0:
        return None  # the line is still being written
    return rest[:end].strip().decode("ascii", "replace").rstrip("/") or None


class OpencodeServer:
    """One `opencode serve` against the mock, in its own process group and private temp folder.

    `start(mock_base_url)` returns the base URL once the server answers, has loaded our provider
    and (unless `warm_up=False`) has completed one turn. `stop()` sends SIGTERM to the group, then
    SIGKILL, and raises PeerError if any process of the tree survives. `pids()` is the live tree.
    `port=0` lets opencode choose a free port, read back from its output (no port race).
    """

    def __init__(self, binary: Path | None = None, *, port: int = 0, tools: bool = False,
                 warm_up: bool = True, start_timeout_secs: float = START_TIMEOUT_SECS,
                 stop_grace_secs: float = STOP_GRACE_SECS, log_level: str = "WARN",
                 keep_files: bool = False) -> None:
        self.binary = binary or ensure_opencode()
        self.port, self.tools, self.warm_up = port, tools, warm_up
        self.start_timeout_secs, self.stop_grace_secs = start_timeout_secs, stop_grace_secs
        self.log_level, self.keep_files = log_level, keep_files
        self.url: str | None = None
        self.root: Path | None = None  # the run's private folder
        self._proc: subprocess.Popen | None = None
        self._seen: dict[int, int] = {}  # pid → start time of every tree member seen

    def __enter__(self) -> OpencodeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path | None:
        return None if self.root is None else self.root / "opencode.log"

    def start(self, mock_base_url: str) -> str:
        if self._proc is not None:
            raise PeerError("this OpencodeServer is already running")
        self.root = Path(tempfile.mkdtemp(prefix="opencode-peer-"))
        try:
            self._proc = self._spawn(self.root, config_json(mock_base_url, tools=self.tools))
            self.url = self._wait_ready(self._proc, self.root / "opencode.log",
                                        time.monotonic() + self.start_timeout_secs)
            if self.warm_up:
                self.turn("warm-up")
        except BaseException:
            self.stop()
            raise
        return self.url

    def _spawn(self, root: Path, config: str) -> subprocess.Popen:
        dirs = private_dirs(root)
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        cfg = config_path(root)
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(config)
        cmd = [str(self.binary), "serve", "--hostname", "127.0.0.1", "--port", str(self.port),
               "--print-logs", "--log-level", self.log_level]
        with open(root / "opencode.log", "wb") as log:
            return subprocess.Popen(cmd, cwd=dirs["project"], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=peer_env(root, os.environ),
                                    start_new_session=True)  # its own process group

    def turn(self, text: str = "Say something.") -> dict:
        """One whole turn in a new session, shaped as loadgen's target sends it; the answer."""
        if self.url is None:
            raise PeerError("the server is not running")
        try:
            session = http_json("POST", f"{self.url}/session", {"title": "peer-warm-up"})
            answer = http_json("POST", f"{self.url}/session/{session['id']}/message", {
                "parts": [{"type": "text", "text": text}],
                "model": {"providerID": PROVIDER_ID, "modelID": MODEL_ID},
            }, timeout=TURN_TIMEOUT_SECS)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PeerError(f"a turn through opencode failed: {exc!r}{self._log_tail()}") from exc
        error = (answer.get("info") or {}).get("error") if isinstance(answer, dict) else "not JSON"
        if error:
            raise PeerError(f"opencode answered the turn with an error: {error}{self._log_tail()}")
        return answer

    def wait_idle(self, timeout_secs: float = TURN_TIMEOUT_SECS,
                  quiet_secs: float = IDLE_QUIET_SECS) -> int:
        """Wait until no session has been busy for `quiet_secs`; returns the most seen busy.

        opencode finishes a turn whose client went away (loadgen cancels its workers after each
        window), and a saturated server holds accepted requests that are not yet marked busy, so
        the next load point would otherwise share the server with the last one's tail.
        """
        if self.url is None:
            raise PeerError("the server is not running")
        now = time.monotonic()
        deadline, last_busy, most = now + timeout_secs, now, 0
        while True:
            try:
                status = http_json("GET", f"{self.url}/session/status")
                busy = sum(1 for st in status.values()
                           if not isinstance(st, dict) or st.get("type") != "idle")
            except (OSError, ValueError, AttributeError):
                busy = 1  # too loaded to answer in time: certainly not idle
            now = time.monotonic()
            if busy:
                last_busy, most = now, max(most, busy)
            elif now - last_busy >= quiet_secs:
                return most
            if now >= deadline:
                raise PeerError(f"opencode sessions still busy after {timeout_secs:g}s")
            time.sleep(IDLE_POLL_SECS)

    def pids(self) -> list[int]:
        """The live process tree of the server, leader first; empty when not running."""
        if self._proc is None:
            return []
        tree = process_tree(self._proc.pid)
        for pid in tree:
            if (st := _stat(pid)) is not None:
                self._seen.setdefault(pid, st[3])
        return tree

    def stop(self) -> None:
        """Stop the tree (idempotent); its folder is deleted unless `keep_files`."""
        proc = self._proc
        if proc is not None:
            self.pids()  # remember every member: a child that left the group is still ours
            try:
                for sig, wait_secs in ((signal.SIGTERM, self.stop_grace_secs),
                                       (signal.SIGKILL, KILL_WAIT_SECS)):
                    self._signal(proc.pid, sig)
                    if self._wait_gone(proc, time.monotonic() + wait_secs):
                        break
                left = self._survivors(proc.pid)
                if left:
                    raise PeerError(f"opencode processes survived SIGKILL: {left} "
                                    f"(files kept in {self.root})")
            finally:
                self._proc, self.url, self._seen = None, None, {}
        if self.root is not None and not self.keep_files:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- internals
    def _signal(self, pgid: int, sig: signal.Signals) -> None:
        targets = [pgid] + [pid for pid in self._survivors(pgid) if pid != pgid]
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        for pid in targets[1:]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _survivors(self, pgid: int) -> list[int]:
        stats = _all_stats()
        left = {pid for pid, st in stats.items() if st[1] == pgid and st[2] != "Z"}
        left.update(pid for pid, started in self._seen.items()
                    if pid in stats and stats[pid][3] == started and stats[pid][2] != "Z")
        return sorted(left)

    def _wait_gone(self, proc: subprocess.Popen, deadline: float) -> bool:
        try:
            proc.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            return False
        while self._survivors(proc.pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECS)
        return True

    def _wait_ready(self, proc: subprocess.Popen, log_path: Path, deadline: float) -> str:
        """Listening line, then /global/health, then the project instance with our provider."""
        url = None
        while url is None:
            url = listening_url(log_path.read_bytes())
            if url is None:
                self._check_alive(proc, deadline, "print its listening line")
                time.sleep(POLL_SECS)
        while True:  # the line comes just before the socket accepts; confirm over HTTP
            try:
                if http_json("GET", f"{url}/global/health", timeout=2.0):
                    break
            except (OSError, ValueError):
                pass
            self._check_alive(proc, deadline, f"answer GET {url}/global/health")
            time.sleep(POLL_SECS)
        try:  # the first request for the project boots its instance (config, providers)
            answer = http_json("GET", f"{url}/config/providers",
                               timeout=max(deadline - time.monotonic(), 1.0))
        except (OSError, ValueError) as exc:
            raise PeerError(f"GET /config/providers failed: {exc!r}{self._log_tail()}") from exc
        providers = {p.get("id"): p for p in answer.get("providers", [])}
        if MODEL_ID not in ((providers.get(PROVIDER_ID) or {}).get("models") or {}):
            raise PeerError(f"opencode did not load provider {PROVIDER_ID!r} with model "
                            f"{MODEL_ID!r}; it has {sorted(providers)}{self._log_tail()}")
        return url

    def _check_alive(self, proc: subprocess.Popen, deadline: float, what: str) -> None:
        check_starting({"opencode": proc}, deadline, what, self.start_timeout_secs,
                       self._log_tail, PeerError)

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()[-LOG_TAIL_BYTES:] if self.log_path else b""
        except OSError:
            return ""
        return f"\n--- opencode log (tail) ---\n{data.decode('utf-8', 'replace')}" if data else ""


if __name__ == "__main__":
    import sys

    from bench.peer_opencode_check import main

    sys.exit(main())
