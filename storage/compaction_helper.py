"""The process a log's compaction hands its segment rewrites to (storage/segment_rewrites.py).

Why a process: checking a segment's named records and scanning whole segments is Python work
(up to ~1 s of it for a pass of ~40,000 superseded checkpoints). On a thread of the process that
serves the commits — the gateway, whose log holds the checkpoint PUTs — it held the GIL the
event loop needs back after every syscall. Here it has no GIL to share, and it runs under the
idle scheduling policy (`below_the_commits`), so the commits' threads come first. Measured end
to end: 1.16× the 10k write checkpoints/s, neutral in mixed runs, and not yet separable in the
runs a big pass falls in (bench/results/2026-12-02-compaction-helper-10k-ab/).

The protocol, on the helper's stdin and stdout: each message is a 4-byte little-endian length
and a msgpack map. The log's process sends a job (segment_rewrites.py lists them), the helper
answers with the job's result or `{"error": text}`; one job at a time. The helper ends when its
stdin does (its parent stopped), at once if its parent dies, never on a signal to its parent's
process group (it has a group of its own); the next job starts it again after a crash.
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
from typing import BinaryIO

import msgpack

from agentos import cpu_layout, module_command

LENGTH = struct.Struct("<I")
MAX_MESSAGE_BYTES = 256 << 20
NICENESS = 10
STOP_SECS = 5.0


class HelperFailed(RuntimeError):
    """The helper answered an error, or died before it answered. `errno`: the error's own, when the
    job failed on one (a full disk: ENOSPC)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def read_message(stream: BinaryIO) -> dict | None:
    """The next message, or None at the end of the stream."""
    head = stream.read(LENGTH.size)
    if not head:
        return None
    if len(head) < LENGTH.size:
        raise EOFError("the stream ended inside a message's length")
    (length,) = LENGTH.unpack(head)
    if length > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {length:,} bytes is over the limit of {MAX_MESSAGE_BYTES:,}")
    body = stream.read(length)
    if len(body) < length:
        raise EOFError("the stream ended inside a message")
    return msgpack.unpackb(body, raw=False)


def write_message(stream: BinaryIO, message: dict) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    stream.write(LENGTH.pack(len(body)) + body)
    stream.flush()


class Helper:
    """The log's end: `call` runs a job in the helper (started on first use, again after a
    crash). One caller at a time: a log's compaction steps run on its one compaction thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def call(self, job: dict) -> dict:
        with self.lock:
            if self.proc is not None and self.proc.poll() is not None:
                self._end()          # it died since the last job
            if self.proc is None:
                self._start()
            try:
                write_message(self.proc.stdin, job)
                reply = read_message(self.proc.stdout)
            except (OSError, EOFError, ValueError) as exc:
                self._end()
                raise HelperFailed(f"the compaction helper went away ({exc})") from None
            if reply is None:
                self._end()
                raise HelperFailed("the compaction helper went away before it answered")
        if "error" in reply:
            code = reply.get("errno")
            raise HelperFailed(str(reply["error"]), code if isinstance(code, int) else None)
        return reply

    def close(self) -> None:
        with self.lock:
            self._end()

    def _start(self) -> None:
        # A group of its own: a signal to its log's group must not reach it before it ignores
        # one (a helper still importing died of the supervisor's SIGTERM to a stopping log, the
        # pass under way failed, and an ERROR was logged at the stop)
        self.proc = subprocess.Popen(module_command("storage.compaction_helper", self.name, str(os.getpid())),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
                                     process_group=0)
        cpu_layout.background_process(self.proc.pid)

    def _end(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            # No job runs (the lock is held): back to the commits' priority to end. Under the idle
            # policy on CPUs busy with other work it got no time to read its stdin's end, and was
            # killed after STOP_SECS (a test beside two CPU-bound loops; a stop held up as long).
            os.sched_setscheduler(proc.pid, os.SCHED_OTHER, os.sched_param(0))
        except (OSError, AttributeError):
            pass                     # it ended already, or the policy is not ours to change
        try:
            proc.stdin.close()       # the helper ends at the end of its stdin
        except OSError:
            pass
        try:
            proc.wait(STOP_SECS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def below_the_commits() -> None:
    """SCHED_IDLE: a CPU running only the helper counts as idle to the scheduler, so a commit's
    thread waking up is placed there and runs at once. With the helper at niceness 10 the
    gateway's loop thread still waited on a run queue for 12-28% of a pass though the CPUs were
    not full (bench/results/2026-12-03-pass-schedstat-10k/). Where the policy is refused, a
    niceness."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        os.nice(NICENESS)


def main(name: str, parent_pid: int) -> int:
    from agentos import service
    from storage import segment_rewrites

    service.set_title(f"compaction/{name}")
    # A signal to the log's process group is the log's to handle: the supervisor stops a child
    # with SIGTERM to its group, and a helper ending there cut short a rewrite the stopping log
    # still waited for (an ERROR logged at every stop that fell in a pass). The helper ends when
    # its log closes its stdin, and at once (SIGKILL) if its log dies: nobody is left to answer.
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a terminal's ^C is the supervisor's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    service.die_with_parent(parent_pid, signal.SIGKILL)
    below_the_commits()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr          # nothing else may write on the protocol's stream
    while True:
        try:
            job = read_message(stdin)
        except (EOFError, ValueError, msgpack.UnpackException) as exc:
            write_message(stdout, {"error": f"unreadable job: {exc}"})
            return 1                 # the stream is out of step: the parent starts a new helper
        if job is None:
            return 0
        try:
            reply = segment_rewrites.run(job)
        except Exception as exc:  # noqa: BLE001 — any failure is the job's, answered, never fatal
            reply = {"error": f"{type(exc).__name__}: {exc}"}
            if isinstance(exc, OSError) and exc.errno:
                reply["errno"] = exc.errno
        write_message(stdout, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
