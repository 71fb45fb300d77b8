"""Where a `sync` read waits for writer/store to get to (storage/store_process.py), with a fake bus.

What readers rely on: the target is where each log is durable as its writer says, not where its
files end (a batch may be written and not yet fsync'd); a writer it has heard from that does not
answer now counts as far as its files go; one never heard from is waited for.
"""
from __future__ import annotations

import asyncio
import logging

import pytest

from agentos.config import from_dict
from broker.protocol import Kind
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
    import threading

    from broker.protocol import Message

    class _ReplyBus(_Bus):
        def __init__(self):
            super().__init__({})
            self.replies = []

        def reply(self, msg, kind, body):
            self.replies.append(body)

    async def go():
        bus = _ReplyBus()
        service = _service(tmp_path, bus, files={0: 0, 1: 0})
        service.store.checkpointed.add("blob:known")
        service.store.query = lambda *a: ([{"key": "k", "seq": 1, "payload": b"x"}], None)
        busy = threading.Event()
        service.queries.submit(busy.wait, 10)                       # a pass's question, running
        try:
            new = Message("gateway/0", Kind.STORE_QUERY, 1, 0.0, 0, "", "",
                          {"query": "blob_latest", "session": "new", "sync_to": []})
            await asyncio.wait_for(service.on_query(new), 2.0)
            assert bus.replies == [{"rows": []}]
            known = Message("gateway/0", Kind.STORE_QUERY, 2, 0.0, 0, "", "",
                            {"query": "blob_latest", "session": "known", "sync_to": []})
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
