"""What every child process shares: identity, signals, logging, and the asyncio runner.

A child gets its title (`agent-os: actor/3`), dies with its supervisor (PR_SET_PDEATHSIG, so
no orphan survives a kill -9 of the tree), ignores SIGINT (the supervisor owns Ctrl-C) and
finishes its current work on SIGTERM: the signal handler only sets an event.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import signal
import sys
from typing import Awaitable, Callable

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_PARENT_GONE = 3
EXIT_LEASE_LOST = 4

_PR_SET_PDEATHSIG = 1
RELEASE_FREE_MEMORY_EVERY_SECS = 60
MAX_OPEN_FILES = 1 << 20   # what the gateway asks for at most (each connection is one)


def set_title(name: str) -> None:
    try:
        import setproctitle
    except ImportError:  # optional at runtime: a title is a convenience, not a function
        return
    setproctitle.setproctitle(f"agent-os: {name}")


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send us `sig` when our parent dies; exit if it is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        sys.exit(EXIT_PARENT_GONE)


def raise_open_files_limit() -> tuple[int, int]:
    """Lift the soft limit on open files to the hard one, for this process and its children.

    Each client connection is a file in the gateway; most Linux systems start a service with a
    soft limit of 1024 (the hard one is far higher), so a gateway past ~1000 concurrent streams
    would fail to accept more. Returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, MAX_OPEN_FILES) if hard != resource.RLIM_INFINITY else MAX_OPEN_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return soft, wanted
        except (ValueError, OSError):
            pass
    return soft, soft


def setup_logging(name: str, level: str | None = None) -> logging.Logger:
    level = level or os.environ.get("AGENT_OS_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return logging.getLogger(f"agent-os.{name}")


def run(main: Callable[[asyncio.Event], Awaitable[int | None]]) -> int:
    """Run `main(stop_event)` on uvloop; SIGTERM sets the event."""
    import uvloop

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        housekeeping = asyncio.create_task(_housekeeping())
        try:
            code = await main(stop)
        finally:
            housekeeping.cancel()
            _metrics().flush()
        return EXIT_OK if code is None else code

    return uvloop.run(runner())


def _metrics():
    from agentos import metrics  # imported late: PROMETHEUS_MULTIPROC_DIR must be set first
    return metrics


async def _housekeeping(release_every: int = RELEASE_FREE_MEMORY_EVERY_SECS) -> None:
    """Metrics flushed each second; the heap's free pages handed back each `release_every`
    seconds (agentos/native_memory.py: malloc keeps up to 8 MiB of them between bursts)."""
    from agentos import native_memory
    ticks = 0
    while True:
        await asyncio.sleep(1.0)
        _metrics().flush()
        ticks += 1
        if ticks % release_every == 0:
            native_memory.release_free_memory()
