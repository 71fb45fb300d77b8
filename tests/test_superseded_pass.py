"""The superseded-checkpoint pass asks the store about several sealed segments at once and
forgets their rows once, after rewriting them (storage/compaction.py `_drop_superseded`)."""
import asyncio
import logging
import types
from concurrent.futures import ThreadPoolExecutor

from broker.protocol import Kind
from storage import compaction, records, segment_rewrites, segments
from storage.records import RecordKind
from storage.store import Store
from tests.test_retention import StoreOverBus


class CountingStore(StoreOverBus):
    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.asked: list[tuple[str, int, int]] = []

    async def request(self, target, kind, body, timeout):
        if kind in (Kind.STORE_SUPERSEDED, Kind.STORE_FORGET):
            self.asked.append((kind.value, body["start"], body["end"]))
        return await super().request(target, kind, body, timeout)


def blob(session: str, seq: int) -> bytes:
    return records.frame(RecordKind.BLOB, f"{session}{seq}".encode(), records.encode_body(
        {"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq, "payload": b"p" * 1000, "at": 1.0}))


def blobs_in_log(directory) -> list[str]:
    return [f"{b['session']}{b['seq']}" for _, path in segments.list_segments(directory)
            for _, kind, _, body, _ in records.scan(path.read_bytes()) if kind == RecordKind.BLOB
            for b in [records.decode_body(body)]]


def test_a_pass_asks_about_segments_in_groups_and_drops_what_each_session_superseded(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "SEGMENTS_PER_QUERY", 2)
    directory = tmp_path / "wal" / "0"
    log = segments.SegmentLog(directory, segment_bytes=4096)     # three checkpoints a segment
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    bus = CountingStore(store)
    writer = types.SimpleNamespace(index=0, directory=directory, compaction_io=ThreadPoolExecutor(1), object_store=None,
                                   rewriter=segment_rewrites.InProcess(), segment_edits=asyncio.Lock(),
                                   shipper=None, log=logging.getLogger("test"), bus=bus,
                                   config=types.SimpleNamespace(storage=types.SimpleNamespace(
                                       retention_secs=3600, compaction_interval_secs=30)))
    try:
        for seq in range(1, 9):          # a1 b1 a2 b2 … a8 b8: 16 checkpoints, five segments sealed
            log.write(blob("a", seq), sync=True)
            log.write(blob("b", seq), sync=True)
        sealed = compaction.sealed_segments(directory)
        assert len(sealed) == 5
        store.load_all()
        asyncio.run(compaction.compact_once(writer))
        # three questions (segments 1-2, 3-4, 5), each followed by one forgetting of the same range
        ranges = [(sealed[0][0], sealed[1][1]), (sealed[2][0], sealed[3][1]), (sealed[4][0], sealed[4][1])]
        assert bus.asked == [(kind, lo, hi) for lo, hi in ranges
                             for kind in (Kind.STORE_SUPERSEDED.value, Kind.STORE_FORGET.value)]
        # every checkpoint a newer one superseded is gone from the sealed segments; the segment
        # being written (a8 b8) is never touched
        assert blobs_in_log(directory) == ["a8", "b8"]
        assert store.query("blob_latest", "a")[0][0]["seq"] == 8
        assert compaction.read_mark(directory) == sealed[-1][1]
        seqs = store.conns["messages"].execute(
            "SELECT session, seq FROM checkpoints WHERE kind = 'blob' ORDER BY session").fetchall()
        assert seqs == [("a", 8), ("b", 8)]      # only the newest rows stay (b8 also holds the progress)
        # the same pass again: nothing new is sealed, so nothing is asked
        bus.asked.clear()
        asyncio.run(compaction.compact_once(writer))
        assert bus.asked == []
    finally:
        writer.compaction_io.shutdown()
        log.close()
        store.close()
