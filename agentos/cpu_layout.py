"""Where the tree's processes run: the gateway on a CPU of its own, background work off it.

Why: the gateway's event loop is one Python thread that every checkpoint commit and every
streamed turn passes through, and on a small machine the scheduler puts other work on its CPU.
A kernel trace of 10k mixed checkpoint runs on two vCPUs (fdatasync and sched_switch
tracepoints) found the loop runnable but waiting for 0.1-0.2 s of each 2 s run, behind
writer/store's loader, the broker, a spare segment's zeroing — and part of that time the other
CPU was idle, because a wakeup lands the woken thread on the waker's CPU. Held to one CPU, with
writer/store kept off it: 1.81× the checkpoints/s at 0.57× the commit p99 at 10k write, 1.09× at
0.74× mixed, about even at one worker, turns/s unchanged
(bench/results/2026-12-03-gateway-own-cpu-10k/, …-1worker/, 2026-12-03-turns-persist-dec03-twentyfirst/).

So, with `kernel.gateway_own_cpu` (default on) and at least two CPUs allowed to the server:
the gateway runs on one of them; writer/store, the compaction helpers the gateway starts and
the gateway's own background threads (the log's I/O and compaction threads, a spare's zeroing,
the bucket shipper) run on the others. Everything else — broker, actors, scheduler, writer/log —
may run anywhere, the gateway's CPU included when it is idle. With one CPU nothing is pinned.
The CPUs are those the server was started with (a container's or `taskset`'s).

Which one: the last that no other server's gateway on this machine holds (of this user's: the
claims live in the user's own directory, as the run directories do). The supervisor claims it at
start with an advisory lock on a file per CPU (`claim`, in CLAIMS_DIR), held for its life (the
kernel lets go of it however the supervisor ends), and tells its children in the run directory. Without it, every server on a machine put its gateway on the same last CPU and its
writer/store on the others, where the other servers' gateways were not. When every CPU is held,
or no claim can be made, the last one is used, as before.
"""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentos.config import Config

_background: set[int] | None = None    # this process's CPUs for background threads, once placed
CLAIMS_DIR = Path("/tmp") / f"agent-os-{os.getuid()}" / "cpus"   # a lock file per CPU (agentos/rundir.py's parent)


def claim(allowed: set[int], directory: Path = CLAIMS_DIR) -> tuple[int, int] | None:
    """(the last allowed CPU no other server's gateway holds, the descriptor whose lock holds it
    until closed), or None when every one is held or no claim can be made."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    for cpu in sorted(allowed, reverse=True):
        try:
            fd = os.open(directory / f"cpu-{cpu}", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return cpu, fd
    return None


def choose_gateway_cpu(config: "Config", log: logging.Logger) -> tuple[int | None, int | None]:
    """The supervisor's choice at start: (the gateway's CPU or None, the descriptor of its claim
    to keep open for the tree's life or None)."""
    allowed = os.sched_getaffinity(0)
    wanted = config.kernel.gateway_cpu
    if not config.kernel.gateway_own_cpu or len(allowed) < 2:
        return None, None
    if wanted >= 0:
        if wanted in allowed:
            return wanted, None
        log.warning("kernel.gateway_cpu %d is not among this server's CPUs %s: the gateway takes the last",
                    wanted, sorted(allowed))
        return None, None
    claimed = claim(allowed)
    if claimed is None:
        log.info("no CPU to claim for the gateway (each held by another server's, or the claims "
                 "directory %s is not writable): it takes the last", CLAIMS_DIR)
        return None, None
    return claimed


def plan(allowed: set[int], gateway_cpu: int | None = None) -> tuple[set[int], set[int]] | None:
    """(the gateway's CPUs, everything background's), or None when there is no CPU to spare; the
    gateway takes `gateway_cpu` if it is allowed, else the last CPU."""
    if len(allowed) < 2:
        return None
    cpu = gateway_cpu if gateway_cpu in allowed else max(allowed)
    return {cpu}, allowed - {cpu}


def place(role: str, config: "Config", log: logging.Logger, gateway_cpu: int | None = None) -> None:
    """At a child's start, before it starts a thread (threads inherit their creator's CPUs);
    `gateway_cpu`: the CPU its supervisor claimed for the gateway."""
    global _background
    if not config.kernel.gateway_own_cpu or role not in ("gateway", "writer-store"):
        return
    layout = plan(os.sched_getaffinity(0), gateway_cpu)
    if layout is None:
        return
    gateway, background = layout
    mine = gateway if role == "gateway" else background
    try:
        os.sched_setaffinity(0, mine)
    except OSError as exc:       # a CPU taken away meanwhile: run wherever we may
        log.warning("could not pin %s to CPUs %s: %s", role, sorted(mine), exc)
        return
    _background = background
    if role == "gateway":
        log.info("on CPU %s of its own; its background threads and writer/store on %s",
                 ",".join(map(str, sorted(gateway))), ",".join(map(str, sorted(background))))


def background_thread() -> None:
    """Called first by a background thread (or as an executor's initializer): off the gateway's CPU."""
    if _background is not None:
        try:
            os.sched_setaffinity(0, _background)
        except OSError:
            pass


def background_process(pid: int) -> None:
    """A helper process this one started: off the gateway's CPU too."""
    if _background is not None:
        try:
            os.sched_setaffinity(pid, _background)
        except OSError:
            pass
