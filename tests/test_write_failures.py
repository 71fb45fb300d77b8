"""A log's failed writes (storage/write_failures.py): the first said at once, the rest counted
into a line at most every ten seconds, and their end said when a write succeeds again."""
import logging

from storage.write_failures import WriteFailures


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def test_a_run_of_failures_is_said_once_then_every_ten_seconds_and_its_end_once():
    log = logging.getLogger("test.write_failures")
    lines = Lines()
    log.addHandler(lines)
    now = [100.0]
    failures = WriteFailures(log, clock=lambda: now[0])
    try:
        for _ in range(200):            # two hundred batches in a second: one line
            failures.failed(4096, "disk_full", "No space left on device", 3)
            now[0] += 0.005
        assert lines.records == [("ERROR", "log write of 4096 bytes failed (disk_full): No space left on device; "
                                           "answering 3 senders with an error")]
        now[0] = 110.5
        failures.failed(100, "disk_full", "No space left on device", 1)
        assert lines.records[-1] == ("ERROR", "log write of 100 bytes failed (disk_full): No space left on device; "
                                              "answering 1 senders with an error (199 more since the last such line)")
        now[0] = 112.0
        failures.succeeded()
        assert lines.records[-1] == ("WARNING", "log writes succeed again, after 201 failed over 12.0 s")
        assert failures.count == 0 and len(lines.records) == 3
        failures.failed(10, "io_error", "Input/output error", 1)   # a new run is said at once
        assert lines.records[-1][0] == "ERROR" and "(io_error)" in lines.records[-1][1]
        assert "more since" not in lines.records[-1][1]
    finally:
        log.removeHandler(lines)
