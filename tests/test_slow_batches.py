"""A slow log batch is told in the log with its parts (storage/slow_batches.py), at most a line
per interval; a SegmentLog write times its parts; the embedded writer feeds it every batch."""
from __future__ import annotations

import asyncio
import logging
import time

from agentos.config import from_dict
from broker.protocol import Kind
from storage import records, segments
from storage.log_writer import LocalAppend, LogWriter
from storage.slow_batches import SlowBatches, pressure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_fast_batch_says_nothing_and_a_slow_one_says_where_its_time_went(caplog):
    slow = SlowBatches(logging.getLogger("test.slow"), "wal/0", threshold_secs=0.5, clock=Clock(),
                       stalls=lambda: "io some 12.5%")
    with caplog.at_level(logging.WARNING):
        assert slow.check(0.2, (0.0, 0.01, 0.19, 0.001), 10, 4096) is False
        assert _warnings(caplog) == []
        assert slow.check(1.5, (0.1, 0.2, 1.0, 0.004), 12, 8192) is True
    [line] = _warnings(caplog)
    assert "log wal/0: a batch of 12 records (8192 bytes) took 1500 ms" in line
    assert "rotating 100, writing 200, fdatasync 1000, outside the write 200" in line
    assert "on CPU 4.0 ms" in line and "io some 12.5%" in line


def test_slow_batches_in_between_are_counted_into_the_next_line(caplog):
    clock = Clock()
    slow = SlowBatches(logging.getLogger("test.slow"), "wal/0", threshold_secs=0.5, every_secs=10.0, clock=clock,
                       stalls=lambda: "")
    with caplog.at_level(logging.WARNING):
        slow.check(0.9, (0.0, 0.0, 0.9, 0.0), 1, 10)
        clock.now += 3
        assert slow.check(0.8, (0.0, 0.0, 0.8, 0.0), 1, 10) is True    # slow, but not told yet
        clock.now += 3
        slow.check(0.7, (0.0, 0.0, 0.7, 0.0), 1, 10)
        assert len(_warnings(caplog)) == 1
        clock.now += 5
        slow.check(0.6, (0.0, 0.0, 0.6, 0.0), 1, 10)
    lines = _warnings(caplog)
    assert len(lines) == 2
    assert "2 more over 500 ms since the last such line" in lines[1]
    assert "more over" not in lines[0] and "machine stalls" not in lines[0]


def test_pressure_reads_the_ten_second_averages(tmp_path):
    (tmp_path / "io").write_text("some avg10=3.50 avg60=1.00 avg300=0.20 total=1\n"
                                 "full avg10=1.25 avg60=0.50 avg300=0.10 total=1\n")
    (tmp_path / "cpu").write_text("some avg10=40.00 avg60=1.00 avg300=0.20 total=1\n")
    assert pressure("io", str(tmp_path)) == "io some 3.50% / full 1.25%"
    assert pressure("cpu", str(tmp_path)) == "cpu some 40.00%"
    assert pressure("memory", str(tmp_path)) == ""      # a kernel without it: nothing to say


def test_a_segment_write_times_its_parts(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=64 << 10)
    frame = records.frame(records.RecordKind.ACCESS, b"x", records.encode_body({"at": 0, "pad": b"p" * 40_000}))
    began = time.monotonic()
    log.write([frame], sync=True)
    elapsed = time.monotonic() - began
    rotating, writing, syncing, cpu = log.last_phases
    assert min(rotating, writing, syncing, cpu) >= 0.0 and syncing > 0.0
    assert rotating + writing + syncing <= elapsed
    log.write([frame], sync=True)        # does not fit: rotates to a new segment first
    assert log.last_phases[0] > 0.0
    assert len(segments.list_segments(tmp_path)) == 2
    log.close()


def test_the_writer_warns_of_a_batch_whose_fdatasync_was_slow(tmp_path, monkeypatch, caplog):
    config = from_dict({"storage": {"dir": str(tmp_path), "commit_window_us": 0, "segment_bytes": 1 << 20}})
    writer = LogWriter(config, 1, f"ipc://{tmp_path}/no-broker.sock", logging.getLogger("test.writer"), embedded=True)
    writer.bus.send = lambda *args, **kwargs: 0      # no broker here: the store's notices go nowhere
    writer.slow = SlowBatches(writer.log, "wal/1", threshold_secs=0.05, stalls=lambda: "")
    real = segments.os.fdatasync

    async def go():
        await writer.open()
        answers: list = []
        monkeypatch.setattr(segments.os, "fdatasync", lambda fd: (time.sleep(0.08), real(fd)))
        body = {"records": [[int(records.RecordKind.ACCESS), b"r1", records.encode_body({"at": 0})]], "sync": True}
        with caplog.at_level(logging.WARNING):
            writer.on_append(LocalAppend(body, lambda kind, reply: answers.append(kind), 1))
        monkeypatch.setattr(segments.os, "fdatasync", real)
        assert answers == [Kind.LOG_ACK]
        writer.io.submit(writer.segments.close).result()
        writer.io.shutdown()

    asyncio.run(go())
    [line] = _warnings(caplog)
    assert "log wal/1: a batch of 1 records" in line
    fdatasync_ms = float(line.split("fdatasync ")[1].split(",")[0])
    assert fdatasync_ms >= 80
