"""A log line that would repeat many times a second, said at most once every REPEAT_SECS.

The first of a run of like events is said at once; those that follow within the interval are
counted, and the next line says how many there were. For events a full disk or a lost peer makes
by the hundred a second (storage/write_failures.py, storage/log_client.py): one line each buried
the rest of the log.
"""
from __future__ import annotations

import time
from typing import Callable

REPEAT_SECS = 10.0


class Repeats:
    def __init__(self, every_secs: float = REPEAT_SECS, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_secs = every_secs
        self.clock = clock
        self.unsaid = 0
        self.said = float("-inf")

    def due(self) -> str | None:
        """None: count this one and say nothing. Otherwise say it now, ending the line with the
        returned text ("" or " (N more since the last such line)")."""
        now = self.clock()
        if now - self.said < self.every_secs:
            self.unsaid += 1
            return None
        more = f" ({self.unsaid} more since the last such line)" if self.unsaid else ""
        self.said, self.unsaid = now, 0
        return more

    def reset(self) -> None:
        """The run ended: the next event is said at once."""
        self.said, self.unsaid = float("-inf"), 0
