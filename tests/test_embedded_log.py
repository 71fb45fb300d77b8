"""The gateway's own log (storage/log_writer.py with `embedded=True`), driven by calls, no processes.

What the gateway relies on: a SYNC append is answered only after its batch is written, the
batch waits (up to the commit window) for as many SYNC records as the last one held, and a
batch nobody waits on is written and answered all the same.
"""
from __future__ import annotations

import asyncio
import logging

from agentos.config import from_dict
from broker.protocol import Kind
from storage import records, segments
from storage.log_writer import LocalAppend, LogWriter


def _writer(tmp_path, window_us: int) -> LogWriter:
    config = from_dict({"storage": {"dir": str(tmp_path), "commit_window_us": window_us,
                                    "segment_bytes": 1 << 20}})
    writer = LogWriter(config, 1, f"ipc://{tmp_path}/no-broker.sock", logging.getLogger("test"), embedded=True)
    writer.bus.send = lambda *args, **kwargs: 0      # no broker here: the store's notices go nowhere
    return writer


def _append(writer: LogWriter, answers: list, name: str, waiters: int = 1) -> None:
    body = {"records": [[int(records.RecordKind.ACCESS), name.encode(), records.encode_body({"at": 0})]],
            "sync": bool(waiters)}
    writer.on_append(LocalAppend(body, lambda kind, reply: answers.append((name, kind, reply)), waiters))


def test_sync_appends_are_answered_after_their_batch_is_on_disk(tmp_path):
    async def go():
        writer = _writer(tmp_path, 2000)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        answers: list = []
        _append(writer, answers, "a")
        _append(writer, answers, "b")
        assert answers == []                       # nothing is acknowledged before the write
        for _ in range(100):
            if len(answers) == 2:
                break
            await asyncio.sleep(0.005)
        assert [(n, k) for n, k, _ in answers] == [("a", Kind.LOG_ACK), ("b", Kind.LOG_ACK)]
        assert writer.stats["fsyncs"] == 1         # one batch for both
        assert writer.sync_senders == {}           # its batches count records, not senders
        _append(writer, answers, "async-only", waiters=0)
        for _ in range(100):
            if len(answers) == 3:
                break
            await asyncio.sleep(0.005)
        assert answers[2][:2] == ("async-only", Kind.LOG_ACK)
        loop_task.cancel()
        writer.io.submit(writer.segments.close).result()
        writer.io.shutdown()

    asyncio.run(go())
    ids = [rid for _, path in segments.list_segments(tmp_path / "wal" / "1")
           for _, _, rid, _, _ in records.scan(path.read_bytes())]
    assert ids == [b"a", b"b", b"async-only"]


def test_a_batch_waits_for_as_many_sync_records_as_the_last_one_held(tmp_path):
    async def go():
        writer = _writer(tmp_path, 200_000)          # a long window: only the count can end the wait early
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        answers: list = []
        for name in ("a1", "a2", "a3"):
            _append(writer, answers, name)
        while len(answers) < 3:
            await asyncio.sleep(0.002)
        assert writer.last_waiters == 3
        _append(writer, answers, "b1")               # one of the three clients is back ...
        await asyncio.sleep(0.05)
        assert len(answers) == 3                     # ... so the batch waits for the other two
        _append(writer, answers, "b2")
        await asyncio.sleep(0.02)
        assert len(answers) == 3
        _append(writer, answers, "b3")
        while len(answers) < 6:
            await asyncio.sleep(0.002)
        assert writer.stats["fsyncs"] == 2           # a1-a3 in one, b1-b3 in the other
        loop_task.cancel()
        writer.io.submit(writer.segments.close).result()
        writer.io.shutdown()

    asyncio.run(go())
