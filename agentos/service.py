"""What every child process shares: identity, signals, logging, and the asyncio runner.

A child gets its title (`agent-os: actor/3`), dies with its supervisor (PR_SET_PDEATHSIG, so
no orphan survives a kill -9 of the tree), ignores SIGINT (the supervisor owns Ctrl-C) and
finishes its current work on SIGTERM: the signal handler only sets an event. A process that runs
in a terminal on its own (`agent-os worker`) stops on Ctrl-C as on SIGTERM.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import signal
import sys
from typing import Any, Awaitable, Callable, Coroutine

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


class _Lifelong:
    stop: asyncio.Event | None = None       # the running process's (set by `run`)
    died = False


def lifelong(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    """A task that runs beside the process's bus for its whole life (a ticker, a watchdog, a
    loader). One that ends with an error would leave the process up without it — timers that
    never fire, sessions never evicted — and nothing said until exit: instead it is logged
    CRITICAL with its traceback, and the process stops (EXIT_FAILURE) for the supervisor to
    restart. Ending without an error, or cancelled, is quiet."""
    task = asyncio.create_task(coro)
    task.add_done_callback(_lifelong_done)
    return task


def _lifelong_done(task: asyncio.Task) -> None:
    if task.cancelled() or task.exception() is None:
        return
    name = getattr(task.get_coro(), "__qualname__", task.get_name())
    exc = task.exception()
    logging.getLogger("agent-os").critical("%s died (%s: %s); stopping this process for its supervisor to "
                                           "restart it", name, type(exc).__name__, exc, exc_info=exc)
    _Lifelong.died = True
    if _Lifelong.stop is not None:
        _Lifelong.stop.set()


def run(main: Callable[[asyncio.Event], Awaitable[int | None]], interrupt: bool = False) -> int:
    """Run `main(stop_event)` on uvloop; SIGTERM sets the event (SIGINT too with `interrupt`,
    else it is ignored), and so does a `lifelong` task's death (the exit code is then
    EXIT_FAILURE)."""
    import uvloop

    async def runner() -> int:
        stop = _Lifelong.stop = asyncio.Event()
        _Lifelong.died = False
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        if interrupt:
            loop.add_signal_handler(signal.SIGINT, stop.set)
        else:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        housekeeping = lifelong(_housekeeping())
        try:
            code = await main(stop)
        finally:
            housekeeping.cancel()
            _metrics().flush()
            _Lifelong.stop = None
        if _Lifelong.died:
            return EXIT_FAILURE
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
