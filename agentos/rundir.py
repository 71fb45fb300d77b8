"""The run directory: where a running tree keeps its ipc:// sockets, resolved config and tables.

Its path is derived from the configuration (kernel.run_dir, else a short path under /tmp keyed
by the storage directory) so that `agent-os status` and `agent-os trace` find a running server
from the same config. It is private to the server's user (mode 0700). ipc:// paths must stay
under ~100 bytes, which is why the default lives in /tmp rather than beside the data.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agentos.config import Config, ConfigError

_MAX_IPC_PATH = 100


class RunDirBusy(RuntimeError):
    """Another live server owns this run directory."""


class RunDir:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @classmethod
    def for_config(cls, config: Config) -> "RunDir":
        if config.kernel.run_dir:
            return cls(Path(config.kernel.run_dir).absolute())
        key = hashlib.sha1(str(Path(config.storage.dir).absolute()).encode()).hexdigest()[:12]
        return cls(Path("/tmp") / f"agent-os-{os.getuid()}" / key)

    def create(self) -> None:
        if len(str(self.path / "broker.sock")) > _MAX_IPC_PATH:
            raise ConfigError(f"kernel.run_dir: {self.path} is too long for ipc:// sockets; choose a shorter path")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.path, 0o700)
        self.metrics_dir.mkdir(mode=0o700, exist_ok=True)

    @property
    def bus_endpoint(self) -> str:
        return f"ipc://{self.path}/broker.sock"

    @property
    def trace_endpoint(self) -> str:
        return f"ipc://{self.path}/trace.sock"

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def processes_path(self) -> Path:
        return self.path / "processes.json"

    @property
    def placement_path(self) -> Path:
        """{"gateway_cpu": N or null}: the CPU the supervisor claimed for the gateway (agentos/cpu_layout.py)."""
        return self.path / "placement.json"

    @property
    def metrics_dir(self) -> Path:
        return self.path / "metrics"

    def port_file(self, role: str) -> Path:
        return self.path / f"{role}.port"

    def read_port(self, role: str) -> int | None:
        try:
            return int(self.port_file(role).read_text().strip())
        except (OSError, ValueError):
            return None

    def write_json(self, path: Path, data: Any) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())


def write_port_file(path: str | os.PathLike, port: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


def claim(run_dir: RunDir) -> None:
    """Claim the run directory: refuse if a live supervisor owns it, clear what a dead one left.

    Called before anything imports prometheus-client, which creates its files on import.
    """
    run_dir.create()
    pid_file = run_dir.path / "supervisor.pid"
    try:
        other = int(pid_file.read_text())
    except (OSError, ValueError):
        other = 0
    if other and other != os.getpid() and _is_agent_os(other):
        raise RunDirBusy(f"another agent-os server (pid {other}) is using run directory {run_dir.path}")
    for stale in [*run_dir.path.glob("*.port"), *run_dir.path.glob("*.json"), *run_dir.metrics_dir.glob("*.db")]:
        stale.unlink(missing_ok=True)
    pid_file.write_text(str(os.getpid()))


def release(run_dir: RunDir) -> None:
    pid_file = run_dir.path / "supervisor.pid"
    try:
        if int(pid_file.read_text()) == os.getpid():
            pid_file.unlink()
    except (OSError, ValueError):
        pass


def _is_agent_os(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"agent-os" in cmdline
