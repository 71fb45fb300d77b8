"""Restate as the peer of the step benchmark: run it privately and serve our scenarios on it.

Owns: one throw-away Restate node per `RestateServer` (all of its data in a private temp dir,
ports chosen by the kernel on 127.0.0.1), the Python service process that serves
bench/restate_services.py, its registration with the admin API, stopping both process groups
(also on errors), and the manual-check CLI. Never does: install (bench/restate_install.py),
generate load (bench/restate_load.py), or touch any other Restate, port or folder.

API (stable; the step benchmark calls it):

    from bench.peer_restate import RestateServer, run_scenario, SCENARIOS
    with RestateServer() as server:          # installs if needed, starts, registers, probes
        row = run_scenario(server, "sync_steps", clients=64, warmup_secs=3, duration_secs=10)
        server.pids()                        # Restate + service processes, for memory sampling
    # row: {"scenario", "clients", "ops_per_sec", "unit", "p50_ms", "p99_ms", "errors",
    #       "server_cpu_secs", "service_cpu_secs", "window_secs", ...extras}

`RestateServer(settings={...}, asgi_server="hypercorn"|"granian")`: `settings` overrides keys of
Restate's config file (defaults otherwise: 24 partitions, fsync on, telemetry off;
`TUNED_SETTINGS` is the tuned variant);
`asgi_server` picks what serves the SDK app (hypercorn is what the SDK documents; granian, a
Rust HTTP server, costs about half the service CPU per call here). `ensure_restate(cache_dir)`
returns the native server binary, `versions()` names what ran. The scenarios and exactly what
each one times are described in bench/restate_load.py.

Ports: `--use-random-ports true --bind-ip 127.0.0.1` lets the kernel pick the ingress, admin and
node-to-node ports (no free-port race); Restate also listens on unix sockets in its base dir, so
the admin API is reached over `admin.sock` and the ingress port is read back from `GET /version`.
hypercorn serves a listening socket created here (port 0) and inherited by the child.

    python -m bench.peer_restate --scenarios sync_steps,flows,attr_read --clients 32 \\
        --duration 10 --warmup 3        (bench/restate_cli.py: the options)
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from bench.peer_opencode import check_starting, process_tree
from bench.restate_install import (
    PeerError,
    check_python_packages,
    ensure_restate,
    versions,
)
from bench.restate_load import SCENARIOS, run_scenario

NODE_NAME = "bench"
START_TIMEOUT_SECS = 60.0
STOP_GRACE_SECS = 5.0  # the data is thrown away: no need to wait for Restate's full drain
KILL_WAIT_SECS = 5.0
POLL_SECS = 0.05
LOG_TAIL_BYTES = 4000
DEFAULT_SETTINGS: dict[str, Any] = {"disable-telemetry": True}
# `settings=TUNED_SETTINGS` (CLI --tuned): what cut Restate's CPU per call by ~25% here: fewer
# partitions for 2 cores, no journal kept after an invocation completes (workflow results are
# still kept, attach needs them), no Prometheus recorder, no RocksDB perf counters.
TUNED_SETTINGS: dict[str, Any] = {
    "default-num-partitions": 4, "default-journal-retention": "0s",
    "disable-prometheus": True, "rocksdb-perf-level": "disable",
}
ASGI_SERVERS = ("hypercorn", "granian")  # hypercorn: the SDK's documented choice
SERVICE_TITLE = "agent-os: bench/restate-service"
__all__ = ["SCENARIOS", "TUNED_SETTINGS", "PeerError", "RestateServer", "ensure_restate",
           "run_scenario", "versions"]


# ---------------------------------------------------------------------------------- commands
def toml_text(settings: dict[str, Any]) -> str:
    """Restate's config file: scalar keys first, then one `[table]` per dict (one level deep)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a valid TOML basic string
        raise ValueError(f"unsupported config value {v!r}")

    lines = [f"{k} = {value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for table, items in settings.items():
        if isinstance(items, dict):
            lines += ["", f"[{table}]"] + [f"{k} = {value(v)}" for k, v in items.items()]
    return "\n".join(lines) + "\n"


def server_command(binary: Path, config_path: Path, base_dir: Path) -> list[str]:
    return [str(binary), "--config-file", str(config_path), "--base-dir", str(base_dir),
            "--node-name", NODE_NAME, "--no-logo", "--use-random-ports", "true",
            "--bind-ip", "127.0.0.1", "--log-format", "compact",
            "--log-disable-ansi-codes", "true"]


def service_command(asgi_server: str, fd: int | None = None, port: int | None = None) -> list[str]:
    """hypercorn serves the socket inherited as `fd`; granian binds 127.0.0.1:`port` itself."""
    if asgi_server == "hypercorn" and fd is not None:
        return [sys.executable, "-m", "bench.restate_services", "--fd", str(fd),
                "--title", SERVICE_TITLE]
    if asgi_server == "granian" and port is not None:
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--http", "2",
                "--loop", "uvloop", "--no-ws", "--workers", "1", "--runtime-threads", "1",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                "--no-access-log", "--process-name", SERVICE_TITLE, "--factory",
                "bench.restate_services:make_app"]
    raise ValueError(f"no command for asgi_server={asgi_server!r} with fd={fd} port={port}")


def child_env() -> dict[str, str]:
    """The caller's environment without RESTATE_* (Restate reads its settings from those)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_")}


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = raw[raw.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return sorted(members)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


# ------------------------------------------------------------------------------------- server
class RestateServer:
    """One private Restate node plus our service endpoint, registered; a context manager."""

    def __init__(self, binary: Path | None = None, *, settings: dict[str, Any] | None = None,
                 tmp_root: str | os.PathLike | None = None, keep_files: bool = False,
                 start_timeout_secs: float = START_TIMEOUT_SECS,
                 stop_grace_secs: float = STOP_GRACE_SECS, asgi_server: str = "hypercorn") -> None:
        if asgi_server not in ASGI_SERVERS:
            raise ValueError(f"asgi_server must be one of {ASGI_SERVERS}, got {asgi_server!r}")
        self.asgi_server = asgi_server
        self.binary = binary
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.tmp_root = Path(tmp_root or tempfile.gettempdir())
        self.keep_files = keep_files
        self.start_timeout_secs = start_timeout_secs
        self.stop_grace_secs = stop_grace_secs
        self.root: Path | None = None
        self.ingress_url: str | None = None
        self.service_url: str | None = None
        self._server: subprocess.Popen | None = None
        self._service: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def admin_socket(self) -> Path:
        if self.root is None:
            raise PeerError("the server is not started")
        return self.root / "data" / NODE_NAME / "admin.sock"

    def start(self) -> str:
        """Start Restate and the service, register it; returns the ingress URL."""
        if self._server is not None:
            raise PeerError("already started")
        check_python_packages(self.asgi_server)
        binary = self.binary or ensure_restate()
        deadline = time.monotonic() + self.start_timeout_secs
        self.root = Path(tempfile.mkdtemp(prefix="restate-", dir=self.tmp_root))
        try:
            config_path = self.root / "restate.toml"
            config_path.write_text(toml_text(self.settings))
            scratch = self.root / "tmp"   # its invoker leaves a temp dir per partition behind in TMPDIR
            scratch.mkdir()
            with open(self.root / "restate.log", "ab") as log:
                self._server = subprocess.Popen(
                    server_command(binary, config_path, self.root / "data"), cwd=self.root,
                    env={**child_env(), "TMPDIR": str(scratch)}, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)
            self._start_service()
            self.ingress_url = self._wait_admin(deadline)["ingress_endpoint"].rstrip("/")
            self._wait_service(deadline)
            self.register(self.service_url, deadline)
            self._wait_ingress(deadline)
        except BaseException:
            self.stop()
            raise
        return self.ingress_url

    def _start_service(self) -> None:
        repo = Path(__file__).resolve().parents[1]
        with socket.socket() as sock, open(self.root / "service.log", "ab") as log:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if self.asgi_server == "hypercorn":
                sock.listen(1024)  # the child serves this very socket: no port race
                cmd, fds = service_command("hypercorn", fd=sock.fileno()), (sock.fileno(),)
            else:
                # granian cannot adopt a socket; the port is free until it binds it, and
                # a lost race shows as granian exiting, which _wait_service reports.
                cmd, fds = service_command(self.asgi_server, port=port), ()
                sock.close()
            self.service_url = f"http://127.0.0.1:{port}"
            self._service = subprocess.Popen(
                cmd, cwd=repo, env=child_env(), pass_fds=fds, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_service(self, deadline: float) -> None:
        port = int(self.service_url.rsplit(":", 1)[1])
        while True:
            self._check_alive(deadline, "see the service accept connections")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                return
            except OSError:
                time.sleep(POLL_SECS)

    def admin(self, method: str, path: str, body: Any = None,
              timeout: float = 10.0) -> tuple[int, Any]:
        """One admin API call over Restate's unix socket: (status, decoded JSON or None)."""
        conn = _UnixHTTPConnection(self.admin_socket, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data,
                         headers={"content-type": "application/json"} if data else {})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")

    def register(self, uri: str, deadline: float) -> Any:
        """POST /deployments for the service at `uri` (discovery runs inside this call)."""
        status, answer = self.admin("POST", "/deployments", {"uri": uri},
                                    timeout=max(deadline - time.monotonic(), 1.0))
        if status not in (200, 201):
            raise PeerError(f"registering {uri} failed with {status}: {answer}{self.log_tail()}")
        return answer

    def _wait_admin(self, deadline: float) -> dict:
        while True:
            self._check_alive(deadline, "answer GET /version on its admin socket")
            try:
                status, answer = self.admin("GET", "/version", timeout=2.0)
                if status == 200 and isinstance(answer, dict) and answer.get("ingress_endpoint"):
                    return answer
            except OSError:
                pass
            time.sleep(POLL_SECS)

    def _wait_ingress(self, deadline: float) -> None:
        """The ingress learns new services asynchronously: probe until a call goes through."""
        host, port = self.ingress_url.rsplit("/", 1)[-1].rsplit(":", 1)
        while True:
            self._check_alive(deadline, "serve a first call through its ingress")
            conn = http.client.HTTPConnection(host, int(port), timeout=5.0)
            try:
                conn.request("POST", "/Steps/ping")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(POLL_SECS)

    def _check_alive(self, deadline: float, what: str) -> None:
        check_starting({"restate-server": self._server, "service": self._service}, deadline,
                       what, self.start_timeout_secs, self.log_tail, PeerError)

    def log_tail(self) -> str:
        out = ""
        for name in ("restate.log", "service.log"):
            try:
                data = (self.root / name).read_bytes()[-LOG_TAIL_BYTES:] if self.root else b""
            except OSError:
                data = b""
            if data:
                out += f"\n--- {name} (tail) ---\n{data.decode('utf-8', 'replace')}"
        return out

    # -- sampling
    def server_pids(self) -> list[int]:
        return process_tree(self._server.pid) if self._server is not None else []

    def service_pids(self) -> list[int]:
        return process_tree(self._service.pid) if self._service is not None else []

    def pids(self) -> list[int]:
        """Every live process of the peer: Restate's tree, then the service's."""
        return self.server_pids() + self.service_pids()

    # -- stopping
    def stop(self) -> None:
        """SIGTERM both groups, a grace period, SIGKILL; raises if anything survived."""
        procs = [p for p in (self._service, self._server) if p is not None]
        try:
            for proc in procs:
                _signal_group(proc.pid, signal.SIGTERM)
            left = self._wait_gone(procs, time.monotonic() + self.stop_grace_secs)
            if left:
                for pgid in left:
                    _signal_group(pgid, signal.SIGKILL)
                left = self._wait_gone(procs, time.monotonic() + KILL_WAIT_SECS)
            if left:
                raise PeerError(f"processes survived SIGKILL in groups {left} "
                                f"(files kept in {self.root})")
        finally:
            self._server = self._service = None
            self.ingress_url = self.service_url = None
        if self.root is not None and not self.keep_files:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    @staticmethod
    def _wait_gone(procs: list[subprocess.Popen], deadline: float) -> list[int]:
        """Reap the leaders and wait until their groups are empty; the groups still alive."""
        while True:
            for proc in procs:
                proc.poll()
            left = [p.pid for p in procs if p.returncode is None or group_members(p.pid)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(POLL_SECS)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    from bench.restate_cli import main

    sys.exit(main())
