"""Saying which part of a slow log batch took the time.

`agentos_log_fsync_ms` counts slow batches, but a count cannot tell a stalled disk from a
starved writer. A turn sweep round at c=1000 once had batches of 1-2 s with the device's cache
flushes quick (bench/results/2026-12-02-turns-persist-dec02-seventeenth-final/): whether the
time went to the writes, the fdatasync, a rotation or somewhere outside the writing call could
only be guessed afterwards. So a batch over SLOW_BATCH_SECS is logged as a WARNING with its
parts (as etcd warns of a slow fdatasync): the seconds rotating to a new segment, writing,
syncing, and outside the write call (waiting for the I/O thread, acknowledging); the writing
thread's CPU time in the call (little CPU and a long fdatasync: the kernel or the device held
it); and the machine's pressure stall figures (/proc/pressure, Linux ≥ 4.20: how much of the
last 10 s tasks waited for CPU or I/O). At most one line per EVERY_SECS; the lines between are
counted into the next.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

SLOW_BATCH_SECS = 0.5
EVERY_SECS = 10.0


def pressure(resource: str, root: str = "/proc/pressure") -> str:
    """`some avg10` (and `full avg10` where there is one) of /proc/pressure/<resource>, or ''."""
    try:
        with open(f"{root}/{resource}") as f:
            lines = dict(line.split(None, 1) for line in f.read().splitlines() if line)
    except (OSError, ValueError):
        return ""
    out = []
    for kind in ("some", "full"):
        fields = dict(part.split("=", 1) for part in lines.get(kind, "").split() if "=" in part)
        if "avg10" in fields:
            out.append(f"{kind} {fields['avg10']}%")
    return f"{resource} {' / '.join(out)}" if out else ""


class SlowBatches:
    """Fed every fsync'd batch; warns of the slow ones, a line per `every` seconds at most."""

    def __init__(self, log: logging.Logger, name: str, threshold_secs: float = SLOW_BATCH_SECS,
                 every_secs: float = EVERY_SECS, clock: Callable[[], float] = time.monotonic,
                 stalls: Callable[[], str] | None = None) -> None:
        self.log = log
        self.name = name
        self.threshold = threshold_secs
        self.every = every_secs
        self.clock = clock
        self.stalls = stalls if stalls is not None else (lambda: ", ".join(filter(None, map(pressure, ("cpu", "io")))))
        self.said_at: float | None = None
        self.unsaid = 0        # slow batches since the last line, not told one by one

    def check(self, elapsed: float, phases: tuple[float, float, float, float], records: int, size: int) -> bool:
        """True if the batch was slow (whether or not a line was written for it)."""
        if elapsed < self.threshold:
            return False
        now = self.clock()
        if self.said_at is not None and now - self.said_at < self.every:
            self.unsaid += 1
            return True
        rotating, writing, syncing, cpu = phases
        outside = max(0.0, elapsed - rotating - writing - syncing)
        stalls = self.stalls()
        before = f"; {self.unsaid} more over {self.threshold * 1000:.0f} ms since the last such line" if self.unsaid else ""
        self.log.warning(
            "log %s: a batch of %d records (%d bytes) took %.0f ms: rotating %.0f, writing %.0f, fdatasync %.0f, "
            "outside the write %.0f; the writing thread on CPU %.1f ms%s%s", self.name, records, size,
            elapsed * 1000, rotating * 1000, writing * 1000, syncing * 1000, outside * 1000, cpu * 1000,
            f"; machine stalls over the last 10 s: {stalls}" if stalls else "", before)
        self.said_at = now
        self.unsaid = 0
        return True
