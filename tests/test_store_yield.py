"""writer/store gives way to the writers during a burst, within a bound (Store.yield_to_writers)."""
import time

from storage import records, segments
from storage.records import RecordKind
from storage.store import YIELD_SECS, Store


class Waits:
    """Stands in for Store.urgent: records each pause instead of sleeping through it."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        self.calls.append(timeout)
        return self.flag


def blob_log(tmp_path, n: int, size: int) -> segments.SegmentLog:
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=8 << 20)
    for i in range(n):
        body = {"session": f"s{i % 4}", "tenant": "t", "key": "k", "seq": i + 1, "payload": bytes([i % 256]) * size,
                "at": 1.0}
        log.write(records.frame(RecordKind.BLOB, f"b{i}".encode(), records.encode_body(body)), sync=False)
    return log


def opened(tmp_path, yield_mb: float) -> Store:
    store = Store(tmp_path, writers=1, memory_limit_mb=64, yield_bytes=int(yield_mb * (1 << 20)))
    store.open()
    store.urgent = Waits()
    store.read_bytes = 256 << 10     # several batches out of a few MB: a backlog
    return store


def drain(store: Store) -> list[tuple[int, bool]]:
    """The loader's backlog loop (Store.run_loader): (bytes behind, paused) at each yield."""
    seen = []
    while store.load_once() > 0 and store.backlog:
        behind, before = store.behind_bytes(), len(store.urgent.calls)
        store.yield_to_writers()
        seen.append((behind, len(store.urgent.calls) > before))
    return seen


def test_while_writers_append_the_store_pauses_between_batches_and_still_loads_every_record(tmp_path):
    log = blob_log(tmp_path, 200, 16 << 10)
    store = opened(tmp_path, yield_mb=64)
    store.log_grew(0, log.end)
    seen = drain(store)
    assert len(seen) >= 2 and all(paused for _, paused in seen)
    assert set(store.urgent.calls) == {YIELD_SECS}
    assert store.loaded[0] == log.end and store.behind_bytes() == 0
    for s in range(4):   # every session's newest checkpoint, with its bytes
        row = store.query("blob_latest", f"s{s}")[0][0]
        assert row["seq"] == 197 + s and row["payload"] == bytes([(196 + s) % 256]) * (16 << 10)
    store.close()


def test_the_store_stops_pausing_once_it_is_the_bound_behind(tmp_path):
    log = blob_log(tmp_path, 200, 16 << 10)       # about 3.2 MB
    store = opened(tmp_path, yield_mb=1.5)
    store.log_grew(0, log.end)
    seen = drain(store)
    assert [paused for behind, paused in seen] == [behind < 1.5 * (1 << 20) for behind, _ in seen]
    assert any(paused for _, paused in seen) and not all(paused for _, paused in seen)
    assert store.loaded[0] == log.end
    store.close()


def test_no_pause_for_idle_writers_a_waiting_reader_or_a_bound_of_zero(tmp_path):
    log = blob_log(tmp_path, 20, 1 << 10)
    store = opened(tmp_path, yield_mb=64)
    store.log_grew(0, log.end)
    store.grew_at = time.monotonic() - 10 * YIELD_SECS   # the last `log.flushed` is old: writers idle
    store.yield_to_writers()
    store.log_grew(0, log.end)
    store.urgent.set()                                   # a `sync` read waits for the projection
    store.yield_to_writers()
    store.urgent.clear()
    store.yield_bytes = 0
    store.yield_to_writers()
    assert store.urgent.calls == []
    store.yield_bytes = 64 << 20
    store.yield_to_writers()
    assert store.urgent.calls == [YIELD_SECS]
    store.close()
