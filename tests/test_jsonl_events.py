"""The JSON-lines copy of the events (`storage.jsonl_dir`, storage/jsonl_events.py), loaded
in-process from real segment files: every event once, whatever fails or is killed between the
file and DuckDB; and what the loader says of a run of failed batches."""
import logging
import os
import time
from contextlib import contextmanager

import duckdb
import orjson
import pytest

from log_frames import frames
from storage import segments
from storage.store import Store


def lines(path):
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def seqs(path):
    return [e["seq"] for e in lines(path)]


def recorded(store):
    return store.conns["events"].execute("SELECT path, bytes FROM jsonl_progress").fetchall()


@pytest.fixture
def log(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    yield log
    log.close()


@contextmanager
def opened(tmp_path, log, new_events=0, start=0, jsonl="jsonl"):
    """A store with its JSONL copy in `tmp_path/jsonl`, after `new_events` more were logged and
    it loaded them all; closed on the way out."""
    if new_events:
        log.write(b"".join(frames(new_events, start=start)), sync=True)
    store = Store(tmp_path, 1, 64, jsonl_dir=str(tmp_path / jsonl))
    store.open()
    try:
        store.load_all()
        yield store
    finally:
        store.close()


def test_each_event_is_one_line_in_log_order_and_its_end_is_committed_with_the_rows(tmp_path, log):
    path = tmp_path / "jsonl" / "events.jsonl"
    with opened(tmp_path, log, 6) as store:
        assert seqs(path) == [0, 1, 2, 3, 4, 5]
        assert lines(path)[1]["session"] == "s1" and lines(path)[1]["data"]["pad"] == "p" * 100
        assert recorded(store) == [(str(path), path.stat().st_size)]
        log.write(b"".join(frames(2, start=6)), sync=True)
        store.load_all()
        assert seqs(path) == list(range(8))


def test_lines_written_but_never_committed_are_cut_on_open_and_written_once(tmp_path, log):
    """A kill between the file's fdatasync and DuckDB's commit, and one mid-line."""
    path = tmp_path / "jsonl" / "events.jsonl"
    with opened(tmp_path, log, 4) as store:
        log.write(b"".join(frames(3, start=4)), sync=True)
        # What the next batch would write before its commit, then a torn line: the kill.
        store.jsonl.write([{"session": "s1", "seq": 4}, {"session": "s2", "seq": 5}])
        with open(path, "ab") as f:
            f.write(b'{"session":"s0","se')
    store = Store(tmp_path, 1, 64, jsonl_dir=str(tmp_path / "jsonl"))
    store.open()
    try:
        assert seqs(path) == [0, 1, 2, 3]
        store.load_all()
        assert seqs(path) == list(range(7))
        assert recorded(store) == [(str(path), path.stat().st_size)]
    finally:
        store.close()


def test_a_failed_commit_leaves_no_line_and_its_retry_writes_each_once(tmp_path, log, monkeypatch):
    path = tmp_path / "jsonl" / "events.jsonl"
    real = Store._append
    failures = []

    def append(self, db, tables, statement=None):
        if db == "events" and not failures:
            failures.append(db)
            raise duckdb.IOException("the disk said no")
        return real(self, db, tables, statement)

    with opened(tmp_path, log) as store:
        log.write(b"".join(frames(3)), sync=True)
        monkeypatch.setattr(Store, "_append", append)
        with pytest.raises(duckdb.IOException):
            store.load_once()
        assert path.read_bytes() == b""
        store.load_all()
        assert seqs(path) == [0, 1, 2]
        assert store.conns["events"].execute("SELECT count(*) FROM events").fetchone() == (3,)


def test_a_rotated_file_starts_anew_and_a_file_elsewhere_is_never_cut(tmp_path, log):
    path = tmp_path / "jsonl" / "events.jsonl"
    with opened(tmp_path, log, 2) as store:
        path.rename(tmp_path / "jsonl" / "events.jsonl.1")   # a log rotator
        log.write(b"".join(frames(2, start=2)), sync=True)
        store.load_all()
        assert seqs(path) == [2, 3] and seqs(tmp_path / "jsonl" / "events.jsonl.1") == [0, 1]
    # Moved to a directory whose file is longer than what was recorded for the old one.
    other = tmp_path / "other" / "events.jsonl"
    other.parent.mkdir()
    other.write_bytes(b'{"kept": 1}\n' * 100)
    with opened(tmp_path, log, jsonl="other") as store:
        assert other.read_bytes() == b'{"kept": 1}\n' * 100
        assert recorded(store) == [(str(other), other.stat().st_size)]
        log.write(b"".join(frames(1, start=4)), sync=True)
        store.load_all()
        assert len(lines(other)) == 101 and lines(other)[-1]["seq"] == 4


def test_a_directory_that_cannot_take_the_file_fails_the_start(tmp_path, log):
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    store = Store(tmp_path, 1, 64, jsonl_dir=str(blocker / "jsonl"))
    try:
        with pytest.raises(OSError):
            store.open()
    finally:
        store.close()
    assert os.path.getsize(blocker) == 0


def test_a_failing_load_is_said_once_with_its_traceback_and_its_end_once(tmp_path, log, monkeypatch, caplog):
    """writer/store's loader on its own thread, DuckDB refusing two batches in a row (a full disk)."""
    import threading

    real = Store._append
    failures = []

    def append(self, db, tables, statement=None):
        if db == "events" and len(failures) < 2:
            failures.append(db)
            raise duckdb.IOException("No space left on device")
        return real(self, db, tables, statement)

    monkeypatch.setattr(Store, "_append", append)
    with opened(tmp_path, log) as store, caplog.at_level(logging.INFO, logger=store.log.name):
        log.write(b"".join(frames(3)), sync=True)
        loader = threading.Thread(target=store.run_loader)
        loader.start()
        try:
            deadline = time.monotonic() + 20
            while store.stats["records"] < 3 and time.monotonic() < deadline:
                store.wake.set()
                time.sleep(0.05)
        finally:
            store.stopping.set()
            loader.join(10)
        assert seqs(tmp_path / "jsonl" / "events.jsonl") == [0, 1, 2]
    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records if "DuckDB" in r.getMessage()]
    assert said == [("ERROR", "loading a batch into DuckDB failed; retrying", True),
                    ("WARNING", "loading into DuckDB succeeds again, after 2 failed batches", False)]
