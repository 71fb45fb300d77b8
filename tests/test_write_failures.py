"""A log's failed writes and writer/store's failed loads (storage/write_failures.py): the first
said at once, the rest counted into a line at most every ten seconds, and their end said once."""
import errno
import logging

import pytest

from storage.write_failures import LoadFailures, WriteFailures


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
        self.tracebacks = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))
        self.tracebacks.append(record.exc_info is not None)


@pytest.fixture
def said():
    """A logger and what it said."""
    log = logging.getLogger("test.write_failures")
    lines = Lines()
    log.addHandler(lines)
    yield log, lines
    log.removeHandler(lines)


def test_a_run_of_failures_is_said_once_then_every_ten_seconds_and_its_end_once(said):
    log, lines = said
    now = [100.0]
    failures = WriteFailures(log, clock=lambda: now[0])
    full = OSError(errno.ENOSPC, "No space left on device")
    for _ in range(200):            # two hundred batches in a second: one line
        failures.failed(4096, full, 3)
        now[0] += 0.005
    assert lines.records == [("ERROR", "log write of 4096 bytes failed (disk_full): No space left on device; "
                                       "answering 3 senders with an error")]
    now[0] = 110.5
    failures.failed(100, full, 1)
    assert lines.records[-1] == ("ERROR", "log write of 100 bytes failed (disk_full): No space left on device; "
                                          "answering 1 senders with an error (199 more since the last such line)")
    now[0] = 112.0
    failures.succeeded()
    assert lines.records[-1] == ("WARNING", "log writes succeed again, after 201 failed over 12.0 s")
    assert failures.count == 0 and len(lines.records) == 3
    assert failures.failed(10, OSError(errno.EIO, "Input/output error"), 1) == "io_error"   # said at once
    assert lines.records[-1][0] == "ERROR" and "(io_error)" in lines.records[-1][1]
    assert "more since" not in lines.records[-1][1]


def test_short_runs_of_failures_at_the_disks_floor_are_counted_not_said_each(said):
    """At the log's floor of free space a batch is refused, the next taken, and so on."""
    log, lines = said
    now = [0.0]
    failures = WriteFailures(log, clock=lambda: now[0])
    full = OSError(errno.ENOSPC, "No space left on device")
    for _ in range(100):            # ten seconds of runs one batch long, ten a second
        failures.failed(4096, full, 1)
        now[0] += 0.05
        failures.succeeded()
        now[0] += 0.05
    assert lines.records == [
        ("ERROR", "log write of 4096 bytes failed (disk_full): No space left on device; answering 1 senders "
                  "with an error"),
        ("WARNING", "log writes succeed again, after 1 failed over 0.1 s")]
    failures.failed(4096, full, 1)  # ten seconds on: said, with the count
    failures.succeeded()
    assert lines.records[-2:] == [
        ("ERROR", "log write of 4096 bytes failed (disk_full): No space left on device; answering 1 senders "
                  "with an error (99 more since the last such line)"),
        ("WARNING", "log writes succeed again, after 1 failed over 0.0 s")]


def test_failed_loads_are_said_with_a_traceback_once_then_counted_and_their_end_once(said):
    log, lines = said
    now = [0.0]
    failures = LoadFailures(log, clock=lambda: now[0])
    for _ in range(3):
        failures.failed(OSError(errno.ENOSPC, "No space left on device"))
        now[0] += 1.0
    now[0] = 11.5
    failures.failed(OSError(errno.ENOSPC, "No space left on device"))
    failures.succeeded()
    failures.succeeded()            # nothing failed since: nothing to say
    assert lines.records == [
        ("ERROR", "loading a batch into DuckDB failed; retrying"),
        ("ERROR", "loading a batch into DuckDB still fails ([Errno 28] No space left on device) "
                  "(2 more since the last such line); retrying"),
        ("WARNING", "loading into DuckDB succeeds again, after 4 failed batches")]
    assert lines.tracebacks == [True, False, False]
