"""Big files freed a piece at a time (storage/freeing.py): replaced or deleted, their blocks go
back in steps, and what a crash left being freed goes at the next open."""
from __future__ import annotations

import os

from storage import freeing, records, segment_rewrites, segments


def _steps(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = os.ftruncate
    monkeypatch.setattr(freeing.os, "ftruncate", lambda fd, size: sizes.append(size) or real(fd, size))
    monkeypatch.setattr(freeing, "PAUSE_SECS", 0.0)
    return sizes


def test_a_replaced_file_gives_its_blocks_back_in_steps(tmp_path, monkeypatch):
    sizes = _steps(monkeypatch)
    path, tmp = tmp_path / "00000000000000000000.seg", tmp_path / "00000000000000000000.compacting"
    path.write_bytes(b"old" * (5 * freeing.STEP // 3 + 1))          # a little over 5 steps
    tmp.write_bytes(b"new")
    freeing.replace(tmp, path)
    assert path.read_bytes() == b"new" and not tmp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]   # the old one is gone too
    assert sizes == [size for size in (4 * freeing.STEP + 1, 3 * freeing.STEP + 1, 2 * freeing.STEP + 1,
                                       freeing.STEP + 1, 1)]


def test_a_released_file_is_gone_and_small_ones_go_at_once(tmp_path, monkeypatch):
    sizes = _steps(monkeypatch)
    big, small = tmp_path / "7", tmp_path / "8"
    big.write_bytes(bytes(2 * freeing.STEP))
    small.write_bytes(b"x")
    freeing.release(big)
    freeing.release(small)
    assert list(tmp_path.iterdir()) == []
    assert sizes == [freeing.STEP]


def test_what_a_crash_left_being_freed_or_uninstalled_goes_when_the_log_opens(tmp_path):
    log = segments.SegmentLog(tmp_path, 1 << 16, spares=1)
    log.write(records.frame(records.RecordKind.EVENT, b"id-1", b"a record"), sync=True)
    log.close()
    (tmp_path / ("00000000000000065536.seg" + freeing.SUFFIX)).write_bytes(b"half freed")
    # a compaction's rewrite of segment 0, stopped before its install
    uninstalled = (tmp_path / segments.segment_name(0)).with_suffix(segment_rewrites.SUFFIX)
    uninstalled.write_bytes(bytes(3 * freeing.STEP))
    log = segments.SegmentLog(tmp_path, 1 << 16, spares=1)
    log.close()
    assert not list(tmp_path.glob("*" + freeing.SUFFIX)) and not uninstalled.exists()
    assert [start for start, _ in segments.list_segments(tmp_path)] == [0]
    assert [bytes(body) for _, _, _, body, _ in records.scan((tmp_path / segments.segment_name(0)).read_bytes())] == \
        [b"a record"]
