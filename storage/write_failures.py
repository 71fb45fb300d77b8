"""A log's failed writes and writer/store's failed loads, said once and then at most every ten
seconds, and their end.

A full disk fails every batch until space comes back: under load, hundreds a second, each
answered with an error at once. One ERROR line per batch buried the log (237 lines for 237 PUTs
in a by-hand full-disk run); what an operator needs is the first failure, how many followed, and
when writes succeeded again — that last one a WARNING, so it shows wherever the ERRORs do.
"""
from __future__ import annotations

import errno
import logging
import time
from typing import Callable

from agentos import metrics
from agentos.log_repeats import REPEAT_SECS, Repeats


def disk_full(exc: BaseException) -> bool:
    """A failure that only more room on the disk ends (an OSError's, or the compaction helper's
    answer naming one: storage/compaction_helper.py)."""
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)


class WriteFailures:
    """A disk at the log's floor of free space (storage/free_space.py) refuses a batch, takes the
    next once compaction freed a little, refuses the one after: runs of failures a few writes
    long, for as long as the disk stays that full. Each run said with its end made two lines a
    run, ten a second; so a run is said only when its kind of failure was not said within the
    last ten seconds (counted into the next line otherwise), and its end only if it was said."""

    def __init__(self, log: logging.Logger, repeat_secs: float = REPEAT_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.clock = clock
        self.repeat_secs = repeat_secs
        self.repeats: dict[str, Repeats] = {}   # by code: another kind of failure is said at once
        self.count = 0       # failed batches since the last write that succeeded
        self.first = 0.0
        self.said = False    # this run of failures was said

    def failed(self, size: int, exc: OSError, senders: int) -> str:
        """Says (or counts) the failure; returns its code for the senders' error."""
        code = "disk_full" if exc.errno == errno.ENOSPC else "io_error"
        metrics.log_write_errors.inc()
        self.count += 1
        if self.count == 1:
            self.first = self.clock()
        more = self.repeats.setdefault(code, Repeats(self.repeat_secs, self.clock)).due()
        if more is not None:
            self.said = True
            self.log.error("log write of %d bytes failed (%s): %s; answering %d senders with an error%s",
                           size, code, exc.strerror, senders, more)
        return code

    def succeeded(self) -> None:
        """A batch was written (called for every one: the check is a compare)."""
        if self.count:
            if self.said:
                self.log.warning("log writes succeed again, after %d failed over %.1f s", self.count,
                                 self.clock() - self.first)
            self.count, self.said = 0, False


class LoadFailures:
    """writer/store's loader: a batch DuckDB refused (a full disk, say) is tried again every
    second; the first failure is said with its traceback, the rest one line per 10 s."""

    def __init__(self, log: logging.Logger, repeat_secs: float = REPEAT_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.repeats = Repeats(repeat_secs, clock)
        self.count = 0       # in a row, till a batch loads again

    def failed(self, exc: BaseException) -> None:
        self.count += 1
        more = self.repeats.due()
        if more is None:
            return
        if self.count == 1:
            self.log.error("loading a batch into DuckDB failed; retrying", exc_info=exc)
        else:
            self.log.error("loading a batch into DuckDB still fails (%s)%s; retrying",
                           " ".join(str(exc).split())[:200], more)

    def succeeded(self) -> None:
        if self.count:
            self.log.warning("loading into DuckDB succeeds again, after %d failed batches", self.count)
            self.count = 0
            self.repeats.reset()
