"""Children forked from a process that has already imported every role's modules.

Why: a child started with `python -m agentos.child` spends most of its start importing
(aiohttp, DuckDB, prometheus_client…; boto3 only where a bucket is used): 0.35 to 0.9 s of CPU per process, about 5 s for
a whole tree on two cores, and again at every restart. The supervisor starts one fork server
(`python -m agentos.forkserver PARENT_PID FD`) first. It imports the role modules once, holds no
thread, event loop or bus socket, and forks a child on each request. Each child is forked twice:
its intermediate parent exits at once, so the kernel hands it to the supervisor, a child
subreaper. The supervisor then waits for it, signals it and restarts it like any child it
started itself, and the child's parent-death signal is tied to the supervisor as before.

The first fork server is the supervisor's own fork, made before its event loop or any thread
starts (`ForkServer.fork_first`): the supervisor imports the role modules itself, so the server
needs no interpreter start and no import of what the two share (config, bus, metrics, asyncio:
about 0.2 s of CPU at each `agent-os serve`, and 24 MiB less memory in a tree, PSS: the server
and the children share the supervisor's pages of those modules). A server started again later,
once the supervisor has threads and a loop that a fork would copy half-way, is
`python -m agentos.forkserver`. That costs memory: once the children forked before are
restarted too, the supervisor's copy of the role modules is its own (private: +26 MiB in the
chaos benchmark, which kills the fork server and every role in turn) beside the new server's,
until the tree starts again.

The supervisor falls back to `python -m agentos.child` whenever the fork server cannot
serve: not yet ready, dead, slow to answer, or the kernel refused to make it a subreaper.

Protocol (one SOCK_SEQPACKET socket pair, one JSON object per packet):
    server -> supervisor  {"ready": true, "pid": N}                 once, after the imports
    supervisor -> server  {"args": [ROLE, INDEX, RUN_DIR, PARENT]}   fork a child
    server -> supervisor  {"pid": N} | {"error": "..."}
EOF on the socket stops the server.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from agentos import module_command

_PR_SET_CHILD_SUBREAPER = 36
SPAWN_TIMEOUT_SECS = 5.0
REPARENT_TIMEOUT_SECS = 5.0


# -- the supervisor's side ------------------------------------------------------------------

class ForkedProcess:
    """What the supervisor needs of `subprocess.Popen` for a child it adopted as subreaper."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = -255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


class ForkServer:
    """The supervisor's handle on its fork server."""

    def __init__(self, env: dict[str, str], log, enabled: bool = True) -> None:
        self.env = env
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.pid = 0            # the server's pid once it said it is ready
        self.launches = 0
        self.started_wall = 0.0
        self.enabled = enabled and _become_subreaper()
        if enabled and not self.enabled:
            log.info("the kernel refused PR_SET_CHILD_SUBREAPER: children start with python -m agentos.child")

    def fork_first(self, parent_pid: int) -> bool:
        """Import the role modules here and fork the server from this process. Only while the
        caller has no thread and no running event loop (a fork copies a lock held by another
        thread as held); False otherwise, and `launch` starts one with its own interpreter."""
        if not self.enabled or threading.active_count() != 1 or _loop_running():
            return False
        import_roles()
        if threading.active_count() != 1:   # an import started one: not safe to fork after all
            return False
        gc.freeze()   # as the server does: neither side's collections then write to the pages they share
        mine, theirs = self._new_server_socket()
        pid = os.fork()
        if pid == 0:   # the server, and each child it forks: never returns into the supervisor's code
            code = 1
            try:
                mine.close()
                _stdin_from_devnull()
                os.setsid()
                code = exit_code_of(lambda: _run_server(parent_pid, theirs))
            finally:
                _exit(code)
        theirs.close()
        self.proc = ForkedProcess(pid)
        return True

    def launch(self) -> None:
        if not self.enabled:
            return
        _, theirs = self._new_server_socket()
        with theirs:
            self.proc = subprocess.Popen(
                module_command("agentos.forkserver", str(os.getpid()), str(theirs.fileno())),
                env=self.env, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()], start_new_session=True)

    def _new_server_socket(self) -> tuple[socket.socket, socket.socket]:
        """For a new server, after the old one is stopped: (ours, kept as `self.sock`, and the
        server's end)."""
        self.close()
        self.launches += 1
        self.started_wall = time.time()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        self.sock = mine
        return mine, theirs

    async def wait_ready(self, timeout: float) -> bool:
        """Wait for the server's imports; False (and no server) if it did not get there."""
        if self.sock is None:
            return False
        try:
            data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 4096), timeout)
        except (asyncio.TimeoutError, OSError):
            data = b""
        self.pid = _ready_pid(data)
        if not self.pid:
            self.log.warning("the fork server did not start; children start with python -m agentos.child")
            self.close()
            return False
        return True

    @property
    def ready(self) -> bool:
        return bool(self.pid) and self.proc is not None and self.proc.poll() is None

    def spawn(self, args: list[str]) -> ForkedProcess | None:
        """A forked child running `agentos.child` with `args`, or None (start it another way)."""
        if not self.ready:
            return None
        try:
            self.sock.settimeout(SPAWN_TIMEOUT_SECS)
            self.sock.send(json.dumps({"args": args}).encode())
            reply = json.loads(self.sock.recv(4096) or b"{}")
        except (OSError, ValueError) as exc:
            self.log.warning("the fork server failed (%s); starting a new one", exc)
            self.launch()  # ready again once it says so (see poll_ready)
            return None
        finally:
            if self.sock is not None:
                self.sock.setblocking(False)
        pid = reply.get("pid")
        if not pid:
            self.log.warning("the fork server could not fork: %s", reply.get("error", reply))
            return None
        if _parent_of(pid) != os.getpid():  # not adopted: we could not wait for it
            self.log.warning("forked child %d was not re-parented to the supervisor; killing it", pid)
            _kill(pid)
            return None
        return ForkedProcess(pid)

    def poll_ready(self) -> None:
        """After a relaunch: take the server's ready message if it has come (non-blocking)."""
        if self.sock is None or self.pid:
            return
        try:
            data = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        self.pid = _ready_pid(data)
        if not self.pid:
            self.close()

    def close(self) -> None:
        """Stop the server (its children live on: they are the supervisor's)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                _kill(self.proc.pid)
            self.proc.wait()
            self.proc = None
        self.pid = 0


def _ready_pid(data: bytes) -> int:
    """The server's pid from its ready message; 0 for anything else (EOF, garbage)."""
    try:
        return int(json.loads(data)["pid"]) if data else 0
    except (ValueError, KeyError, TypeError):
        return 0


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the fork server ------------------------------------------------------------------------

def _serve(sock: socket.socket) -> list[str] | None:
    """Fork children until EOF; returns None in the server, a child's arguments in a child."""
    while True:
        try:
            data = sock.recv(4096)
        except InterruptedError:
            continue
        if not data:
            return None
        try:
            args = [str(a) for a in json.loads(data)["args"]]
        except (ValueError, KeyError, TypeError) as exc:
            sock.send(json.dumps({"error": f"bad request: {exc}"}).encode())
            continue
        r, w = os.pipe()
        try:
            middle = os.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            sock.send(json.dumps({"error": str(exc)}).encode())
            continue
        if middle == 0:
            os.close(r)
            pid = -1
            try:
                pid = os.fork()
                if pid == 0:
                    os.close(w)
                    sock.close()
                    return args
                os.write(w, str(pid).encode())
            finally:
                if pid != 0:
                    os._exit(0)
        os.close(w)
        os.waitpid(middle, 0)
        with os.fdopen(r, "rb") as pipe:
            text = pipe.read()
        sock.send(json.dumps({"pid": int(text)} if text else {"error": "fork failed"}).encode())


def import_roles() -> None:
    from agentos.child import ROLES
    for module in ROLES.values():
        importlib.import_module(module)


def main(argv: list[str] | None = None) -> int:
    """The server started with its own interpreter: `python -m agentos.forkserver PARENT_PID FD`."""
    args = sys.argv[1:] if argv is None else argv
    parent, fd = int(args[0]), int(args[1])
    from agentos import service
    service.die_with_parent(parent)
    import_roles()
    gc.freeze()   # out of the collector's sight (see _run_server)
    return _run_server(parent, socket.socket(fileno=fd))


def _run_server(parent: int, sock: socket.socket) -> int:
    """Serve forks with the role modules imported; in a forked child, be its role and exit."""
    from agentos import native_memory, service
    native_memory.limit_arenas()   # inherited by every child, before any thread starts
    service.die_with_parent(parent)
    service.set_title("forkserver")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The modules were imported out of the collector's sight (gc.freeze): a child's full
    # collections then do not walk the modules of other roles, and do not write to (and so
    # copy) the pages it shares with this process.
    sock.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    child_args = _serve(sock)
    if child_args is None:
        return 0
    # A forked child: wait until the kernel has handed us to the supervisor, then be the role.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    supervisor = int(child_args[3])
    deadline = time.monotonic() + REPARENT_TIMEOUT_SECS
    while os.getppid() != supervisor and time.monotonic() < deadline:
        time.sleep(0.001)
    from agentos import child
    code = child.main(child_args)
    _exit(0 if code is None else code)


def exit_code_of(run) -> int:
    """`run()`'s exit code as `sys.exit(run())` would make it, without unwinding the stack: a
    SystemExit's code (a role's `service.die_with_parent` exits 3, which the supervisor reads), or
    1 with the traceback on stderr for any other exception."""
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        return 1
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _stdin_from_devnull() -> None:
    """As the server started with its own interpreter has it (and so every child it forks)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _exit(code: int) -> None:
    """What interpreter exit does that matters (join non-daemon threads, run atexit handlers,
    flush), without tearing down every module this process inherited: that took ~0.3 s per
    child at each stop, and the roles close their sockets and databases themselves."""
    import atexit
    import logging
    import threading
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
