"""One live process per role of a tree: each child holds an flock on `RUN_DIR/locks/NAME.lock`
for its whole life, taken before it opens anything of its role's.

Why: two processes of one role are two writers of one log, two owners of one shard. The
supervisor starts one, but a child can start without it knowing: the fork server killed after
it forked a child and before it answered (the chaos benchmark kills it) left that child running,
reparented to the supervisor, while the supervisor, told nothing, started the role again with
`python -m agentos.child`. At a fifth of a CPU (2026-12-07) the two writer/log/0 processes took
turns on the bus and wrote the same segment: its readers found records damaged inside data known
whole, and acknowledged work was lost.

A restart never waits here: the supervisor starts a role again only after it reaped the last one,
and a process's flock goes with its last open descriptor, at its exit. So a lock held means
another live process of this role; the newcomer waits (that one may be on its way out) and gives
up after DUPLICATE_WAIT_SECS (the supervisor also kills such strays: agentos/strays.py).
"""
from __future__ import annotations

import fcntl
import logging
import os
import time

from agentos.rundir import RunDir

DUPLICATE_WAIT_SECS = 10.0
_held: list[int] = []   # the descriptors held for life (the flock goes with them, at exit)


def lock_path(run_dir: RunDir, name: str):
    return run_dir.path / "locks" / (name.replace("/", "-") + ".lock")


def hold(run_dir: RunDir, name: str, log: logging.Logger, wait_secs: float = DUPLICATE_WAIT_SECS) -> bool:
    """Take this role's lock for the life of the process; False if another live process kept it."""
    path = lock_path(run_dir, name)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline, warned = time.monotonic() + wait_secs, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.error("another %s (pid %s) holds %s: exiting, so that one process has this role", name,
                          _holder(fd) or "unknown", path)
                os.close(fd)
                return False
            if not warned:
                log.warning("another %s (pid %s) holds %s; waiting up to %gs for it to end", name,
                            _holder(fd) or "unknown", path, wait_secs)
                warned = True
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)   # (who holds it, for the message above)
    _held.append(fd)
    return True


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
