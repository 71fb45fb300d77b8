"""The turn sweep's reading of the log's fdatasyncs over a window (bench/fsync_window.py)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from agentos.metrics import MS_BUCKETS
from bench import fsync_window


def _exposition(samples: list[float], zeroed: dict[str, int] | None = None) -> str:
    registry = CollectorRegistry()
    histogram = Histogram("agentos_log_fsync_ms", "batch write + fdatasync", buckets=MS_BUCKETS, registry=registry)
    for ms in samples:
        histogram.observe(ms)
    counter = Counter("agentos_log_segments_zeroed_total", "segments zeroed", ["when"], registry=registry)
    for when, n in (zeroed or {}).items():
        counter.labels(when).inc(n)
    compacted = Counter("agentos_compacted_records_total", "records compacted", ["reason"], registry=registry)
    compacted.labels("superseded_checkpoint").inc(len(samples))       # any count that grows with the window
    compacted.labels("expired_access").inc(1)
    return generate_latest(registry).decode()


def test_the_window_counts_only_the_batches_between_the_two_scrapes():
    earlier = [0.3] * 50 + [150.0]                    # a slow batch before the window: not the window's
    during = [0.4] * 96 + [3.0, 4.0, 30.0, 120.0]
    before = fsync_window.parse(_exposition(earlier, {"at_open": 2, "idle": 3}))
    after = fsync_window.parse(_exposition(earlier + during, {"at_open": 2, "idle": 3, "ahead": 2, "at_rotation": 1}))

    window = fsync_window.delta(before, after)

    assert window["batches"] == 100
    assert window["mean_ms"] == round((96 * 0.4 + 3.0 + 4.0 + 30.0 + 120.0) / 100, 3)
    assert window["p50_le_ms"] == 0.5
    assert window["p99_le_ms"] == 50.0
    assert window["max_le_ms"] == 200.0
    assert window["over_5ms"] == 2
    assert window["over_20ms"] == 2
    assert window["over_100ms"] == 1
    assert window["zeroed"] == {"ahead": 2, "at_rotation": 1}     # only what was zeroed in the window
    assert fsync_window.zeroed_text(window["zeroed"]) == "ahead 2, at_rotation 1"
    assert window["compacted"] == len(during)                      # summed over reasons, only the window's


def test_a_window_without_batches_or_without_an_answer_says_so():
    same = fsync_window.parse(_exposition([1.0, 2.0]))
    assert fsync_window.delta(same, same) == {"batches": 0, "zeroed": {}, "compacted": 0}
    assert fsync_window.zeroed_text({}) == "0"
    assert fsync_window.delta(None, same) is None
    assert fsync_window.snapshot("http://127.0.0.1:9", timeout=0.5) is None
