"""The reference stack of the checkpoint benchmark: a private PostgreSQL and a private Redis
(PostgreSQL alone for LangGraph's checkpointer, bench/peer_langgraph.py).

Owns: installing the Debian packages when they are missing, one throw-away PostgreSQL cluster
(initdb into a temp dir, `synchronous_commit=on`, fsync on, every other setting at its default)
and one Redis (`appendonly yes`, `appendfsync everysec` or `always`, otherwise defaults), both
on free loopback ports with their data in a temp dir on the same filesystem as the project, the
`checkpoints` table, and stopping both process groups and deleting the data — also on errors.
Never does: touch the system's own clusters or services, or run any workload.

PostgreSQL refuses to run as root, so when we are root its processes run as the `postgres`
user: `subprocess.Popen(user=, group=, extra_groups=[])` switches user in the child right
before exec, so the pid we hold *is* the postmaster (su/runuser would sit in between and
forward signals). Each server starts in its own session; stopping is the polite signal (SIGINT,
PostgreSQL's fast shutdown; SIGTERM for Redis, which writes its AOF out), a grace period, then
SIGKILL to the whole process group.

    with ReferenceStack(Path("/tmp")) as stack:
        stack.pg_dsn, stack.redis_url
"""
from __future__ import annotations

import fcntl
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from bench.disk_floor import device_of

PG_USER = "postgres"
APPEND_FSYNC_POLICIES = ("everysec", "always")
READY_TIMEOUT_SECS = 60.0
STOP_GRACE_SECS = 30.0
APT_TIMEOUT_SECS = 900.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    agent text NOT NULL,
    task int NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent, task)
)
"""


class StackError(RuntimeError):
    """The reference stack could not be installed, started or reached."""


# ------------------------------------------------------------------------------------ packages
def _pg_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin dir (Debian keeps them versioned)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    postgres = shutil.which("postgres")
    return Path(postgres).resolve().parent if postgres else None


def ensure_installed() -> dict:
    """apt-get install postgresql redis-server if either server is missing (update on failure).
    One install at a time on the machine (a lock file): two at once fail on dpkg's own lock."""
    installed = []
    if _pg_bindir() is None or shutil.which("redis-server") is None:
        if os.geteuid() != 0:
            raise StackError("postgresql or redis-server is missing and we are not root")
        with open(os.path.join(tempfile.gettempdir(), "agent-os-apt.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _pg_bindir() is None or shutil.which("redis-server") is None:   # not installed meanwhile
                _apt_install(["postgresql", "redis-server"])
                installed = ["postgresql", "redis-server"]
    bindir = _pg_bindir()
    redis = shutil.which("redis-server")
    if bindir is None or redis is None:
        raise StackError("postgresql / redis-server still missing after apt-get install")
    return {"pg_bindir": str(bindir), "redis_server": redis, "installed_now": installed}


def _apt_install(packages: list[str]) -> None:
    cmd = ["apt-get", "install", "-y", *packages]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        if subprocess.run(cmd, env=env, timeout=APT_TIMEOUT_SECS, capture_output=True, check=False).returncode:
            subprocess.run(["apt-get", "update"], env=env, timeout=APT_TIMEOUT_SECS, capture_output=True, check=True)
            subprocess.run(cmd, env=env, timeout=APT_TIMEOUT_SECS, capture_output=True, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"apt-get install {' '.join(packages)} failed: {exc}") from exc


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(root: int) -> list[int]:
    """Live descendants of `root`, from the ppid links in /proc."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.split("/")[2]))
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


# --------------------------------------------------------------------------------------- stack
class ReferenceStack:
    """Context manager: a private PostgreSQL + Redis; `pg_dsn`, `redis_url` once entered."""

    def __init__(self, tmp_root: str | os.PathLike | None = None,
                 redis_appendfsync: str = "everysec", keep_data: bool = False, redis: bool = True) -> None:
        if redis_appendfsync not in APPEND_FSYNC_POLICIES:
            raise ValueError(f"redis_appendfsync must be one of {APPEND_FSYNC_POLICIES}")
        self.tmp_root = Path(tmp_root or tempfile.gettempdir())
        self.redis_appendfsync = redis_appendfsync
        self.with_redis = redis   # False: PostgreSQL alone (LangGraph's checkpointer keeps no pointer elsewhere)
        self.keep_data = keep_data
        self.root: Path | None = None
        self.pg_dsn = ""
        self.redis_url = ""
        self.info: dict = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._bindir = Path()

    # -- lifecycle
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        tools = ensure_installed()
        bindir = self._bindir = Path(tools["pg_bindir"])
        self.root = Path(tempfile.mkdtemp(prefix="pgredis-", dir=self.tmp_root))
        pg_data, redis_dir = self.root / "pg", self.root / "redis"
        redis_dir.mkdir()
        run_as: dict = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam(PG_USER)
            run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._check_traversable(self.root, pw)
        self._run([str(bindir / "initdb"), "-D", str(pg_data), "-U", "bench", "--auth=trust",
                   "-E", "UTF8", "--locale=C", "--no-instructions"], run_as)
        pg_port, redis_port = free_port(), free_port()
        self._procs["postgres"] = self._spawn("postgres", [
            str(bindir / "postgres"), "-D", str(pg_data), "-p", str(pg_port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
            "-c", "synchronous_commit=on", "-c", "fsync=on",
        ], run_as)
        if self.with_redis:
            self._procs["redis"] = self._spawn("redis", [
                tools["redis_server"], "--port", str(redis_port), "--bind", "127.0.0.1",
                "--dir", str(redis_dir), "--appendonly", "yes",
                "--appendfsync", self.redis_appendfsync, "--daemonize", "no",
            ], {})
            self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self.pg_dsn = f"postgresql://bench@127.0.0.1:{pg_port}/postgres"
        self._wait_ready(pg_port, redis_port)
        pg_settings = self._create_schema()
        self.info = {
            "data_dir": str(self.root),
            "device": device_of(self.root),
            "postgres_version": _version([str(bindir / "postgres"), "--version"]),
            "pg_settings": {**pg_settings, "other": "defaults"},
            "packages_installed_now": tools["installed_now"],
        }
        if self.with_redis:
            self.info.update(redis_version=_version([tools["redis_server"], "--version"]),
                             redis_settings={"appendonly": "yes", "appendfsync": self.redis_appendfsync,
                                             "other": "defaults"})

    def database(self, name: str) -> str:
        """A new, empty database of the running PostgreSQL; its DSN."""
        if not name.isidentifier():
            raise ValueError(f"not a plain database name: {name!r}")
        proc = self._psql(f"CREATE DATABASE {name}")
        if proc.returncode != 0:
            raise StackError(f"CREATE DATABASE {name} failed: {proc.stderr.strip()}")
        return self.pg_dsn.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        """Stop both servers (signal, grace, SIGKILL to the group) and delete the data dir."""
        polite = {"postgres": signal.SIGINT, "redis": signal.SIGTERM}
        for name, proc in self._procs.items():
            if proc.poll() is None:
                try:
                    proc.send_signal(polite[name])
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_SECS
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in self._procs.values():
            # The group id is the leader's pid (start_new_session); PostgreSQL backends sit in
            # groups of their own, so the leader's descendants are killed one by one as well.
            stragglers = _descendants(proc.pid) if proc.poll() is None else []
            kills = [(os.killpg, proc.pid)] + [(os.kill, pid) for pid in stragglers]
            for kill, pid in kills:
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        if self.root is not None and not self.keep_data:
            shutil.rmtree(self.root, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]

    # -- helpers
    @staticmethod
    def _check_traversable(path: Path, pw: pwd.struct_passwd) -> None:
        for parent in [path, *path.parents]:
            mode = parent.stat().st_mode
            if parent.stat().st_uid != pw.pw_uid and not mode & 0o001:
                raise StackError(f"{parent} is not traversable by {PG_USER}; pick another "
                                 "tmp_root (e.g. /tmp)")

    def _run(self, cmd: list[str], run_as: dict) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                              **run_as)
        if proc.returncode != 0:
            raise StackError(f"{Path(cmd[0]).name} failed: {proc.stderr.strip()[-2000:]}")

    def _spawn(self, name: str, cmd: list[str], run_as: dict) -> subprocess.Popen:
        with open(self._path(f"{name}.log"), "wb") as log:  # the child keeps its own copy
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, **run_as)

    def _path(self, name: str) -> Path:
        if self.root is None:
            raise StackError("the stack has not been started")
        return self.root / name

    def _log_tail(self, name: str) -> str:
        try:
            return self._path(f"{name}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _psql(self, sql: str, timeout_secs: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([str(self._bindir / "psql"), "-X", "-q", "-At", "-v",
                               "ON_ERROR_STOP=1", "-d", self.pg_dsn, "-c", sql],
                              capture_output=True, text=True, timeout=timeout_secs,
                              check=False)

    @staticmethod
    def _redis_ping(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _wait_ready(self, pg_port: int, redis_port: int) -> None:
        """Both servers answer a real request, or one died, or the deadline passed."""
        deadline = time.monotonic() + READY_TIMEOUT_SECS
        pending = set(self._procs)
        while pending:
            for name in sorted(pending):
                proc = self._procs[name]
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with {proc.returncode}: "
                                     f"{self._log_tail(name)}")
                if name == "postgres":
                    ready = self._psql("SELECT 1", timeout_secs=5).returncode == 0
                else:
                    ready = self._redis_ping(redis_port)
                if ready:
                    pending.discard(name)
            if pending:
                if time.monotonic() > deadline:
                    raise StackError(f"not ready after {READY_TIMEOUT_SECS}s: {sorted(pending)}")
                time.sleep(0.1)

    def _create_schema(self) -> dict[str, str]:
        """The table, then the settings PostgreSQL actually runs with (refuse a non-durable one)."""
        proc = self._psql(SCHEMA)
        if proc.returncode != 0:
            raise StackError(f"CREATE TABLE failed: {proc.stderr.strip()}")
        proc = self._psql("SELECT name, setting FROM pg_settings WHERE name IN ("
                          "'synchronous_commit', 'fsync', 'wal_sync_method', 'full_page_writes',"
                          " 'shared_buffers')")
        settings = dict(line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line)
        if settings.get("synchronous_commit") != "on" or settings.get("fsync") != "on":
            raise StackError(f"PostgreSQL is not durable as configured: {settings}")
        return settings
