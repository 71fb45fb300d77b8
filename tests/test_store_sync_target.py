"""Where a `sync` read waits for writer/store to get to (storage/store_progress.py), with a fake bus.

What readers rely on: the target is where each log is durable as its writer says, not where its
files end (a batch may be written and not yet fsync'd); a writer it has heard from that does not
answer now counts as far as its files go; one never heard from is waited for. And which reads
wait for a thread that something slow holds: a new task's first read waits for nothing, a read
never waits for a compaction pass's question, and a DuckDB file's reopen waits for both.
"""
from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from agentos.config import from_dict
from broker.protocol import Kind, Message
from broker.requests import Undeliverable
from storage.store_process import StoreService


class _Reply:
    def __init__(self, body):
        self.body = body


class _Bus:
    def __init__(self, ends: dict[str, int]):
        self.ends = ends          # writer name -> durable end; absent: not on the bus
        self.asked: list[tuple[str, float]] = []

    async def request(self, dest, kind, body, timeout=5.0, **_):
        assert kind is Kind.STATS
        self.asked.append((dest, timeout))
        if dest not in self.ends:
            raise Undeliverable(f"{dest}: not connected")
        return _Reply({"stats": {"end": self.ends[dest]}})


class _ReplyBus(_Bus):
    def __init__(self):
        super().__init__({})
        self.replies = []

    def reply(self, msg, kind, body):
        self.replies.append(body)


def _message(kind, body, rid=1):
    return Message("gateway/0", kind, rid, 0.0, 0, "", "", body)


def _close(service: StoreService, pool) -> None:
    """After a test with an opened store: `pool` (the other thread it used) stopped, the store
    closed on its query thread, that thread stopped."""
    pool.shutdown()
    service.queries.submit(service.store.close).result()
    service.queries.shutdown()


def _service(tmp_path, bus, files: dict[int, int]) -> StoreService:
    config = from_dict({"storage": {"dir": str(tmp_path)}})       # two logs: writer/log/0, the gateway's
    service = StoreService(config, f"ipc://{tmp_path}/no-broker.sock", logging.getLogger("test"))
    service.bus = bus
    service.store.log_ends = lambda: dict(files)
    service.loop = asyncio.get_running_loop()
    return service


def test_the_target_is_where_each_writer_says_its_log_is_durable(tmp_path):
    async def go():
        bus = _Bus({"writer/log/0": 900, "writer/log/1": 40})
        service = _service(tmp_path, bus, files={0: 1500, 1: 40})      # 600 bytes not fsync'd yet
        service.flushed.update({0: 700})
        assert await service.sync_target() == {0: 900, 1: 40}
        assert service.flushed == {0: 900, 1: 40}                       # the loader may go that far now
        assert {dest for dest, _ in bus.asked} == {"writer/log/0", "writer/log/1"}
    asyncio.run(go())


def test_a_writer_heard_from_before_that_does_not_answer_counts_as_far_as_its_files(tmp_path):
    async def go():
        bus = _Bus({"writer/log/1": 40})                                # writer/log/0 is restarting
        service = _service(tmp_path, bus, files={0: 1500, 1: 40})
        service.writers_open.add(0)                                     # its notices came before
        assert await service.sync_target() == {0: 1500, 1: 40}
        assert ("writer/log/0", 2.0) in bus.asked                       # asked briefly, not for 30 s
    asyncio.run(go())


def test_a_writer_never_heard_from_is_waited_for(tmp_path):
    async def go():
        bus = _Bus({"writer/log/1": 40})                                # writer/log/0 still restoring
        service = _service(tmp_path, bus, files={0: 10, 1: 40})
        with pytest.raises(Undeliverable):
            await service.sync_target()
        assert ("writer/log/0", 30.0) in bus.asked
    asyncio.run(go())


def test_at_start_the_loader_waits_for_each_writer_to_say_where_its_log_is_durable(tmp_path):
    class _LateBus(_Bus):
        async def request(self, dest, kind, body, timeout=5.0, **kwargs):
            if dest == "writer/log/1" and not any(d == dest for d, _ in self.asked):
                self.asked.append((dest, timeout))
                raise Undeliverable(f"{dest}: not connected yet")     # the gateway starts last
            return await super().request(dest, kind, body, timeout, **kwargs)

    async def go():
        bus = _LateBus({"writer/log/0": 900, "writer/log/1": 40})
        service = _service(tmp_path, bus, files={0: 1500, 1: 40})
        service.flushed = {}
        service.store.limits = service.flushed
        learning = asyncio.create_task(service.learn_ends())
        await asyncio.sleep(0.1)
        assert service.store.limits == {0: 900}                         # not the files' 1500
        await asyncio.wait_for(learning, 5)                             # writer/log/1 retried after 1 s
        assert service.store.limits == {0: 900, 1: 40}
    asyncio.run(go())


def test_a_first_read_of_a_session_without_checkpoints_does_not_queue_behind_a_slow_query(tmp_path):
    """The query thread may be busy for half a second with a compaction pass's question; a read
    of a session that has no checkpoint (a new task's first) is answered without it."""
    async def go():
        bus = _ReplyBus()
        service = _service(tmp_path, bus, files={0: 0, 1: 0})
        service.store.checkpointed.add("blob:known")
        service.store.query = lambda *a: ([{"key": "k", "seq": 1, "payload": b"x"}], None)
        busy = threading.Event()
        service.queries.submit(busy.wait, 10)                       # a pass's question, running
        try:
            new = _message(Kind.STORE_QUERY, {"query": "blob_latest", "session": "new", "sync_to": []})
            await asyncio.wait_for(service.on_query(new), 2.0)
            assert bus.replies == [{"rows": []}]
            known = _message(Kind.STORE_QUERY, {"query": "blob_latest", "session": "known", "sync_to": []}, 2)
            waiting = asyncio.ensure_future(service.on_query(known))
            await asyncio.sleep(0.2)
            assert not waiting.done()                               # this one needs the query thread
            busy.set()
            await asyncio.wait_for(waiting, 5.0)
            assert bus.replies[1]["rows"][0]["key"] == "k"
        finally:
            busy.set()
            service.queries.shutdown()
    asyncio.run(go())


def test_a_compaction_pass_question_holds_up_no_read_and_a_reopen_waits_for_it(tmp_path):
    """Which checkpoints a segment holds are superseded takes half a second at 60,000 of them:
    it runs on a thread of its own with cursors of its own, so reads go on meanwhile; a reopen of
    the file (`storage.duckdb_recycle_secs`) closes those cursors too, so it waits for the
    question to end, and both threads' cursors work after it."""
    async def go():
        loop = asyncio.get_running_loop()
        bus = _ReplyBus()
        service = _service(tmp_path, bus, files={0: 0, 1: 0})
        await loop.run_in_executor(service.queries, service.store.open)
        inside, release = threading.Event(), threading.Event()
        superseded = service.store.superseded_blobs

        def slow(*args):
            inside.set()
            release.wait(10)
            return superseded(*args)

        service.store.superseded_blobs = slow
        ask = {"writer": 0, "start": 0, "end": 1 << 40}
        count = {"query": "count", "session": ""}
        try:
            question = asyncio.ensure_future(service.on_superseded(_message(Kind.STORE_SUPERSEDED, ask)))
            assert await loop.run_in_executor(None, inside.wait, 5)
            await asyncio.wait_for(service.on_query(_message(Kind.STORE_QUERY, count, 2)), 2.0)
            assert len(bus.replies) == 1 and bus.replies[0]["rows"][0]["checkpoints"] == 0
            reopen = loop.run_in_executor(service.queries, service.store.recycle)
            await asyncio.sleep(0.3)
            assert not reopen.done() and not question.done()
            release.set()
            await asyncio.wait_for(question, 5.0)
            await asyncio.wait_for(reopen, 5.0)
            assert bus.replies[1] == {"rows": []}
            service.store.superseded_blobs = superseded
            await asyncio.wait_for(service.on_superseded(_message(Kind.STORE_SUPERSEDED, ask, 3)), 5.0)
            await asyncio.wait_for(service.on_query(_message(Kind.STORE_QUERY, count, 4)), 5.0)
            assert bus.replies[2:] == [{"rows": []}, bus.replies[0]]
        finally:
            release.set()
            _close(service, service.passes)
    asyncio.run(go())


def test_a_forget_naming_a_position_that_is_not_one_is_answered_as_an_error(tmp_path):
    """A peer's bad positions reach DuckDB as sent (off the loop); it refuses them, the pass hears
    an error and tries later, and the store goes on answering."""
    async def go():
        loop = asyncio.get_running_loop()
        bus = _ReplyBus()
        service = _service(tmp_path, bus, files={0: 0, 1: 0})
        await loop.run_in_executor(service.queries, service.store.open)
        try:
            bad = {"writer": 0, "start": 0, "end": 1 << 40, "positions": [1, "x"]}
            await asyncio.wait_for(service.on_forget(_message(Kind.STORE_FORGET, bad)), 5.0)
            assert bus.replies[0]["rows"] == [] and "forgetting checkpoints" in bus.replies[0]["error"]
            good = dict(bad, positions=[1, 2])
            await asyncio.wait_for(service.on_forget(_message(Kind.STORE_FORGET, good, 2)), 5.0)
            assert bus.replies[1] == {"rows": [0]}
        finally:
            _close(service, service.passes)
    asyncio.run(go())


def test_a_latest_read_whose_place_is_known_does_not_queue_behind_the_query_thread(tmp_path):
    """A session whose newest external checkpoint's place writer/store knows is answered with one
    payload read, even while the query thread is held (a reopen, a payload compaction's swap);
    if that place has gone meanwhile (compacted away), the query thread answers instead."""
    from storage import payload_segments, records, segments
    from storage.records import RecordKind

    async def go():
        loop = asyncio.get_running_loop()
        bus = _ReplyBus()
        service = _service(tmp_path, bus, files={0: 0, 1: 0})
        log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
        body = records.encode_body({"session": "s", "tenant": "t", "key": "k1", "seq": 1, "payload": b"state",
                                    "at": 1.0})
        log.write(records.frame(RecordKind.BLOB, b"r1", body), sync=True)
        log.close()
        await loop.run_in_executor(service.queries, service.store.open)
        await loop.run_in_executor(service.queries, service.store.load_all)
        busy = threading.Event()
        service.queries.submit(busy.wait, 10)
        try:
            ask = {"query": "blob_latest", "session": "s", "tenant": "t", "sync_to": []}
            await asyncio.wait_for(service.on_query(_message(Kind.STORE_QUERY, ask)), 2.0)
            assert bus.replies == [{"rows": [{"key": "k1", "seq": 1, "payload": b"state"}]}]
            read = service.store.payloads.read
            gone = [payload_segments.place(0, 0)]

            def compacted_away_once(at, length):          # moved, its old segment deleted, since
                if gone:
                    raise FileNotFoundError(gone.pop())
                return read(at, length)
            service.store.payloads.read = compacted_away_once
            waiting = asyncio.ensure_future(service.on_query(_message(Kind.STORE_QUERY, ask, 3)))
            await asyncio.sleep(0.2)
            assert not waiting.done()                     # that read failed: the query thread's turn
            busy.set()
            await asyncio.wait_for(waiting, 5.0)
            assert bus.replies[-1] == {"rows": [{"key": "k1", "seq": 1, "payload": b"state"}]}
            other = {**ask, "tenant": "other"}            # never from the entry: the query says none
            await asyncio.wait_for(service.on_query(_message(Kind.STORE_QUERY, other, 4)), 5.0)
            assert bus.replies[-1] == {"rows": []}
        finally:
            busy.set()
            _close(service, service.payload_reads)
    asyncio.run(go())
