"""Retention drops a closed run whole: never its first records while its last wait in a segment
compaction cannot rewrite yet."""
import asyncio
import logging
import types
from concurrent.futures import ThreadPoolExecutor

from broker.protocol import Kind
from storage import compaction, records, segment_rewrites, segments
from storage.records import RecordKind
from storage.store import Store


class StoreOverBus:
    """Answers writer/log's compaction requests from a real Store, as writer/store would."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def request(self, target, kind, body, timeout):
        s = self.store
        if kind == Kind.STORE_QUERY:
            rows, _ = s.query(body["query"], body["session"], None, None, int(body["after"]), 100)
        elif kind == Kind.STORE_SUPERSEDED:
            rows = s.superseded_blobs(body["writer"], body["start"], body["end"])
        elif kind == Kind.STORE_FORGET:
            rows = [s.forget_superseded(body["writer"], body["start"], body["end"], body["positions"])]
        elif kind == Kind.STORE_PURGE:
            rows = [s.purge_runs(body["runs"])]
        elif kind == Kind.STORE_CLOSED:
            rows = s.closed_records(body["writer"], body["end"])
        elif kind == Kind.STORE_FORGET_CLOSED:
            rows = [s.forget_closed(body["writer"], body["start"], body["end"])]
        else:
            raise AssertionError(kind)
        return types.SimpleNamespace(body={"rows": rows})


def flow(run, kind, seq):
    # 1.5 KB each: two to a 4 KiB segment; `at` long before any retention window
    return records.frame(RecordKind.FLOW, f"{run}-{seq}".encode(),
                         records.encode_body({"run": run, "tenant": "t", "type": kind, "seq": seq, "at": 1.0,
                                              "pad": "x" * 1500}))


def runs_in_log(directory):
    return [records.decode_body(body)["run"] for _, path in segments.list_segments(directory)
            for _, _, _, body, _ in records.scan(path.read_bytes())]


def rows_of(store, run):
    return store.conns["flows"].execute("SELECT count(*) FROM flow_records WHERE run = ?", [run]).fetchone()[0]


def test_a_run_whose_end_is_in_the_segment_being_written_stays_whole_until_that_segment_is_sealed(tmp_path):
    directory = tmp_path / "wal" / "0"
    log = segments.SegmentLog(directory, segment_bytes=4096)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    writer = types.SimpleNamespace(index=0, directory=directory, compaction_io=ThreadPoolExecutor(1), object_store=None,
                                   rewriter=segment_rewrites.InProcess(), segment_edits=asyncio.Lock(),
                                   shipper=None, log=logging.getLogger("test"), bus=StoreOverBus(store),
                                   config=types.SimpleNamespace(storage=types.SimpleNamespace(
                                       retention_secs=1, compaction_interval_secs=30)))
    try:
        # a: both records sealed; b: started in a sealed segment, ended in the one being written
        for frame in (flow("a", "run.started", 0), flow("a", "run.ended", 1), flow("b", "run.started", 0),
                      flow("keep", "run.started", 0), flow("b", "run.ended", 1)):
            log.write(frame, sync=True)
        assert len(segments.list_segments(directory)) == 3
        store.load_all()

        asyncio.run(compaction.compact_once(writer))
        assert runs_in_log(directory) == ["b", "keep", "b"]
        assert rows_of(store, "a") == 0 and rows_of(store, "b") == 2   # b is read whole, as it was

        log.write(flow("keep", "step", 1), sync=True)
        log.write(flow("keep", "step", 2), sync=True)   # seals the segment holding b's end
        store.load_all()
        asyncio.run(compaction.compact_once(writer))
        assert runs_in_log(directory) == ["keep", "keep", "keep"]
        assert rows_of(store, "b") == 0 and rows_of(store, "keep") == 3   # an open run is untouched
    finally:
        log.close()
        store.close()
        writer.compaction_io.shutdown()
