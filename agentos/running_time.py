"""Waiting for something for so many seconds of this process's running time, not the clock's.

A process stopped for longer than a wait's timeout (SIGSTOP, a paused VM, a swap storm) wakes to
find the wait expired, though what it waited for happened meanwhile and sits in its sockets, not
yet read: a session's close then answered "busy, try again" for records its log writer had in
fact acknowledged. Time here is counted in slices of at most MAX_SLICE_SECS, so a stall costs one
slice; a loop kept busy for long stretches waits longer by the clock than `timeout`, which is what
such a loop needs anyway.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

POLL_SECS = 0.01
MAX_SLICE_SECS = 0.25


async def wait_running(done: Callable[[], bool], timeout: float) -> bool:
    """Whether `done()` became true within `timeout` seconds of running time (polled)."""
    waited, last = 0.0, time.monotonic()
    while not done():
        if waited >= timeout:
            return False
        await asyncio.sleep(POLL_SECS)
        now = time.monotonic()
        waited += min(now - last, MAX_SLICE_SECS)
        last = now
    return True
