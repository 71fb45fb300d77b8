"""A log's failed writes, said once and then at most every REPEAT_SECS, and their end.

A full disk fails every batch until space comes back: under load, hundreds a second, each
answered with an error at once. One ERROR line per batch buried the log (237 lines for 237 PUTs
in a by-hand full-disk run); what an operator needs is the first failure, how many followed, and
when writes succeeded again — that last one a WARNING, so it shows wherever the ERRORs do.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

REPEAT_SECS = 10.0


class WriteFailures:
    def __init__(self, log: logging.Logger, repeat_secs: float = REPEAT_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.repeat_secs = repeat_secs
        self.clock = clock
        self.count = 0       # failed batches since the last write that succeeded
        self.unsaid = 0      # of them, since the last line
        self.first = self.said = 0.0

    def failed(self, size: int, code: str, reason: str, senders: int) -> None:
        now = self.clock()
        self.count += 1
        if self.count == 1:
            self.first = now
        elif now - self.said < self.repeat_secs:
            self.unsaid += 1
            return
        more = f" ({self.unsaid} more failed since the last such line)" if self.unsaid else ""
        self.log.error("log write of %d bytes failed (%s): %s; answering %d senders with an error%s",
                       size, code, reason, senders, more)
        self.said, self.unsaid = now, 0

    def succeeded(self) -> None:
        """A batch was written; called only while `count` is set (the caller checks: a hot path)."""
        self.log.warning("log writes succeed again, after %d failed over %.1f s", self.count,
                         self.clock() - self.first)
        self.count = self.unsaid = 0
