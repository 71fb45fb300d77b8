"""A preloaded interpreter that forks the suite's `python -m agentos.cli …` processes.

Why: the suite starts about 200 of them (trees, workers, CLI calls), and each new interpreter spent
about 0.35 s of CPU importing the same third-party libraries (aiohttp, DuckDB, pyzmq, uvloop…) on a
two-core machine where the suite is bound by CPU. The zygote imports those once; each launch is a
fork of it that then does what `python [-P] -m MODULE ARGS` does: a session of its own, its
working directory, its environment, stdin on /dev/null and stdout and stderr on its log,
sys.argv and sys.path as that command line makes them, and its exit code from `sys.exit` or an
exception. The process tree it starts is the real one, forked by the real supervisor.

Not preloaded by the plain zygote: our own modules and prometheus-client. prometheus-client
picks its multiprocess mode from the environment when first imported (agentos/cli.py sets it up
before that), so every launched process imports them under its own environment, as a new
interpreter does. `agent-os serve`, which always runs in multiprocess mode, has a zygote of its
own (`shared(SERVE)`) that also imports what a supervisor and its fork server import, about 0.2 s
of CPU a tree: prometheus-client in multiprocess mode (its metric values, made in the zygote,
reopen their files in the directory the launched supervisor names at their first use, as they
do after any fork), our modules, and the roles'. Our modules read no environment and no clock
at import, so a fork of that zygote starts as a new interpreter would.

What stays the zygote's: the third-party modules' import-time state, and the seed of str and
bytes hashes (every process one zygote launches shares it, where new interpreters would each draw
their own). `TEST_ZYGOTE=0` makes the harness start plain subprocesses instead.

Protocol (JSON lines over a socket pair):
    harness -> zygote  {"module", "args", "cwd", "env", "stdout", "stderr", "safe_path"}: fork one
    zygote -> harness  {"pid": N}: its answer
    zygote -> harness  {"exited": N, "code": C}: N ended (the zygote is its parent, and reaps it)
EOF on the socket stops the zygote; what it launched lives on, as subprocesses would.
"""
from __future__ import annotations

import json
import os
import queue
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NoReturn

PRELOADED = ("asyncio", "argparse", "dataclasses", "logging", "aiohttp", "aiohttp.web", "duckdb", "zmq",
             "zmq.asyncio", "msgpack", "orjson", "uvloop", "yaml", "crc32c", "setproctitle")


def enabled() -> bool:
    return os.environ.get("TEST_ZYGOTE", "1") != "0"


# -- the harness's side ---------------------------------------------------------------------

class ZygoteGone(RuntimeError):
    """A launch's exit was asked for after the zygote ended: no one can report it any more."""


class Launched:
    """What the harness keeps of a launched process: the part of `subprocess.Popen` it uses. Its
    `returncode` is set by the zygote's reader when the zygote reports the exit."""

    def __init__(self, zygote: "Zygote", pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.args: list[str] = []
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.ended:
            if not self.zygote.ended.wait_for(lambda: self.returncode is not None or self.zygote.gone, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        if self.returncode is None:   # its parent, the only one that could tell, is gone
            raise ZygoteGone(f"the test zygote (pid {self.zygote.proc.pid}) is gone: how pid {self.pid} "
                             f"({' '.join(self.args[2:])}) ends cannot be known")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


PLAIN, SERVE = "plain", "serve"   # the zygote kinds: see the module's docstring


class Zygote:
    def __init__(self, kind: str = PLAIN) -> None:
        self.sock, theirs = socket.socketpair()
        # where the serve zygote's own metric values write (see _preload_the_server)
        self.metrics_dir = tempfile.mkdtemp(prefix="zygote-metrics-") if kind == SERVE else ""
        self.proc = subprocess.Popen([sys.executable, "-P", str(Path(__file__)), str(theirs.fileno()), kind,
                                      self.metrics_dir],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.running: dict[int, Launched] = {}   # by pid, until the zygote reports its exit
        self.ended = threading.Condition()
        self.gone = False   # the zygote's end of the socket closed: no exit is reported after
        self._answers: queue.Queue = queue.Queue()
        self._launching = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def launch(self, module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path,
               safe_path: bool = True, stderr: Path | None = None) -> Launched:
        """`python [-P] -m MODULE ARGS` with stdout on `log` (appended to) and stderr on `stderr`
        (the same file unless given)."""
        request = {"module": module, "args": list(args), "cwd": str(cwd), "env": dict(env), "stdout": str(log),
                   "stderr": str(stderr or log), "safe_path": safe_path}
        for path in {log, stderr or log}:
            open(path, "ab").close()   # there from the start, as a subprocess's output file is
        with self._launching:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
            try:
                answer = self._answers.get(timeout=30)
            except queue.Empty:
                raise RuntimeError(f"the test zygote (pid {self.proc.pid}) did not answer a launch") from None
        if not isinstance(answer, Launched):
            raise RuntimeError(f"the test zygote could not launch {module} {args}: {answer}")
        answer.args = [sys.executable, "-m", module, *args]
        return answer

    def _read(self) -> None:
        for line in self.sock.makefile("rb"):
            self._heard(json.loads(line))
        with self.ended:   # a wait on what it launched would otherwise run to its timeout
            self.gone = True
            self.ended.notify_all()
        self._answers.put({"error": "the zygote is gone"})

    def _heard(self, message: dict) -> None:
        # In the zygote's order: a pid's exit is reported before the kernel can give the pid again
        # (pid_max is 32768 here, and the suite forks more processes than that).
        if "exited" in message:
            with self.ended:
                launched = self.running.pop(message["exited"], None)
                if launched is not None:
                    launched.returncode = message["code"]
                self.ended.notify_all()
        elif "pid" in message:
            launched = self.running[message["pid"]] = Launched(self, message["pid"])
            self._answers.put(launched)
        else:
            self._answers.put(message)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.proc.wait(10)
        self._reader.join(10)
        self.sock.close()
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


_zygotes: dict[str, Zygote] = {}
_made = threading.Lock()


def shared(kind: str = PLAIN) -> Zygote:
    """This test process's zygote of that kind, started at first use (`close_shared` stops it)."""
    with _made:
        zygote = _zygotes.get(kind)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _zygotes[kind] = Zygote(kind)
        return zygote


def close_shared() -> None:
    with _made:
        while _zygotes:
            _zygotes.popitem()[1].close()


# -- the zygote's side ------------------------------------------------------------------------

def _serve(sock: socket.socket) -> None:
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)   # a handler, not SIG_IGN: the zygote reaps, and reports
    pending = b""
    while True:
        readable, _, _ = select.select([sock, woken_r], [], [])
        if woken_r in readable:
            os.read(woken_r, 4096)
        _report_exits(sock)
        if sock in readable:
            data = sock.recv(1 << 16)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    _become(json.loads(line), sock, (woken_r, woken_w))
                sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.sendall(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _become(request: dict, sock: socket.socket, pipe: tuple[int, int]) -> NoReturn:
    """In the forked child: be `python [-P] -m MODULE ARGS` as the request says. It never returns
    to the zygote's loop: it ends as that interpreter would, by SystemExit or the module's own
    exception unwinding to the top, then the interpreter's exit (threads joined, exit handlers,
    streams flushed)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(sock.detach())
    for fd in pipe:
        os.close(fd)
    os.setsid()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_APPEND),
                            (2, request["stderr"], os.O_WRONLY | os.O_APPEND)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["env"].get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
    sys.path[:] = _path_for(request)
    sys.argv = [request["module"], *request["args"]]   # runpy puts the module's file first
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


_BASE_PATH: list[str] = []   # the interpreter's own sys.path entries (not from PYTHONPATH or -P)


def _path_for(request: dict) -> list[str]:
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = [] if request["safe_path"] else [request["cwd"]]
    return first + [os.path.abspath(p) for p in extra] + _BASE_PATH


def _preload_the_server(metrics_dir: str) -> None:
    """What `agent-os serve` imports before its first fork, in prometheus-client's multiprocess
    mode. The values made at import write to `metrics_dir` until a launched process's first use
    (its pid differs) reopens them where its own PROMETHEUS_MULTIPROC_DIR says."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    import agentos.cli  # noqa: F401
    import agentos.supervisor  # noqa: F401
    from agentos import forkserver
    forkserver.import_roles()
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    ours = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    _BASE_PATH[:] = [p for p in sys.path if os.path.abspath(p) not in ours]
    import importlib
    for module in PRELOADED:
        importlib.import_module(module)
    if sys.argv[2] == SERVE:
        _preload_the_server(sys.argv[3])
    import setproctitle
    # set up here: once a child has replaced its environment, setproctitle finds no room to write
    # (a title of "agent-os: …" is how `agent-os serve` tells a live server from a reused pid)
    setproctitle.setproctitle(setproctitle.getproctitle())
    assert threading.active_count() == 1, "a preloaded module started a thread: forks would copy it half-way"
    sys.stdout.flush()
    sys.stderr.flush()
    _serve(sock)   # returns here in the zygote alone, at EOF: a launched process ends by SystemExit
    if sys.argv[2] == SERVE:   # also when the harness could not say so (a test process killed)
        shutil.rmtree(sys.argv[3], ignore_errors=True)


if __name__ == "__main__":
    main()
