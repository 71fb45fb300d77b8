"""A log's failed writes, said once and then at most every ten seconds, and their end.

A full disk fails every batch until space comes back: under load, hundreds a second, each
answered with an error at once. One ERROR line per batch buried the log (237 lines for 237 PUTs
in a by-hand full-disk run); what an operator needs is the first failure, how many followed, and
when writes succeeded again — that last one a WARNING, so it shows wherever the ERRORs do.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from agentos.log_repeats import REPEAT_SECS, Repeats


class WriteFailures:
    def __init__(self, log: logging.Logger, repeat_secs: float = REPEAT_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.clock = clock
        self.repeats = Repeats(repeat_secs, clock)
        self.count = 0       # failed batches since the last write that succeeded
        self.first = 0.0

    def failed(self, size: int, code: str, reason: str, senders: int) -> None:
        self.count += 1
        if self.count == 1:
            self.first = self.clock()
        more = self.repeats.due()
        if more is not None:
            self.log.error("log write of %d bytes failed (%s): %s; answering %d senders with an error%s",
                           size, code, reason, senders, more)

    def succeeded(self) -> None:
        """A batch was written; called only while `count` is set (the caller checks: a hot path)."""
        self.log.warning("log writes succeed again, after %d failed over %.1f s", self.count,
                         self.clock() - self.first)
        self.count = 0
        self.repeats.reset()
