"""Processes of the tree that the supervisor did not start, found among its children and killed.

As a child subreaper the supervisor inherits every orphan of its tree. One kind must not live on:
a child the fork server forked just before it was killed, before it could name it to the
supervisor, which then started that role again (agentos/role_lock.py says what two of a role did).
Such a process carries our title (`agent-os: ROLE`), as does a fork server's half-way fork; the
supervisor's own children, and anything else that became its child (a process its caller's shell
started before it exec'd `agent-os serve`), are left alone.
"""
from __future__ import annotations

import logging
import os
import signal

TITLE = b"agent-os: "


def children_of(pid: int) -> set[int]:
    """The live children of a process, from each of its threads' `children` list."""
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def kill_strays(ours: set[int], log: logging.Logger) -> list[int]:
    """SIGKILL the children of this process titled as ours that are not in `ours`; their pids."""
    killed = []
    for pid in children_of(os.getpid()) - ours:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read(200)
        except OSError:
            continue
        if not title.startswith(TITLE):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning("killed pid %d (%s): not one of this supervisor's children, though of its tree (a fork the "
                    "fork server made as it died)", pid, title.split(b"\0")[0].decode(errors="replace"))
        killed.append(pid)
    return killed
