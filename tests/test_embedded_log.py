"""The gateway's own log (storage/log_writer.py with `embedded=True`), driven by calls, no processes.

What the gateway relies on: an append someone waits on (the log client hands over one per loop
iteration) is written, fdatasync'd and answered by the call that brings it — no task between the
request and its answer; the batch waits (up to the commit window) for as many SYNC records as the
last one held; a batch nobody waits on is written and answered all the same, off the loop's
thread, and nothing else is written to the file while it is.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from agentos.config import from_dict
from broker.protocol import Kind
from storage import records, segments
from storage.log_writer import LocalAppend, LogWriter


def _writer(tmp_path, window_us: int, zero_segments: bool = True) -> LogWriter:
    config = from_dict({"storage": {"dir": str(tmp_path), "commit_window_us": window_us,
                                    "segment_bytes": 1 << 20, "zero_segments": zero_segments}})
    writer = LogWriter(config, 1, f"ipc://{tmp_path}/no-broker.sock", logging.getLogger("test"), embedded=True)
    writer.bus.send = lambda *args, **kwargs: 0      # no broker here: the store's notices go nowhere
    return writer


def _append(writer: LogWriter, answers: list, names: str, waiters: int = 1) -> None:
    """One call, as the log client makes once per loop iteration: a record per name in `names`."""
    body = {"records": [[int(records.RecordKind.ACCESS), name.encode(), records.encode_body({"at": 0})]
                        for name in names.split()], "sync": bool(waiters)}
    writer.on_append(LocalAppend(body, lambda kind, reply: answers.append((names, kind, reply, _on_disk(writer))),
                                 waiters))


def _on_disk(writer: LogWriter) -> list[bytes]:
    return [rid for _, path in segments.list_segments(writer.directory)
            for _, _, rid, _, _ in records.scan(path.read_bytes())]


def _close(writer: LogWriter, loop_task: asyncio.Task) -> None:
    loop_task.cancel()
    writer.io.submit(writer.segments.close).result()
    writer.io.shutdown()


async def _until(condition, secs: float = 2.0) -> None:
    for _ in range(int(secs / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out")


def test_sync_appends_are_on_disk_and_answered_when_the_call_returns(tmp_path):
    async def go():
        writer = _writer(tmp_path, 2000)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        answers: list = []
        _append(writer, answers, "a b", waiters=2)
        # answered within the call, and only once both records were on disk
        assert [(n, k, disk) for n, k, _, disk in answers] == [("a b", Kind.LOG_ACK, [b"a", b"b"])]
        assert writer.stats["fsyncs"] == 1         # one batch for both
        assert writer.sync_senders == {}           # its batches count records, not senders
        _append(writer, answers, "async-only", waiters=0)
        assert len(answers) == 1                   # not in the call: it goes to the I/O thread
        await _until(lambda: len(answers) == 2)
        assert answers[1][:2] == ("async-only", Kind.LOG_ACK)
        _close(writer, loop_task)

    asyncio.run(go())
    ids = [rid for _, path in segments.list_segments(tmp_path / "wal" / "1")
           for _, _, rid, _, _ in records.scan(path.read_bytes())]
    assert ids == [b"a", b"b", b"async-only"]


def test_a_sync_append_waits_while_a_batch_is_on_the_io_thread(tmp_path):
    async def go():
        writer = _writer(tmp_path, 2000)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        write = writer.segments.write

        def slow_write(data, fsync):
            time.sleep(0.1)                          # a slow disk under the ASYNC batch
            return write(data, fsync)
        writer.segments.write = slow_write
        answers: list = []
        _append(writer, answers, "access-rows", waiters=0)
        await _until(lambda: writer.writing)
        writer.segments.write = write
        _append(writer, answers, "checkpoint")
        assert answers == []                         # the file is the I/O thread's until it is done
        await _until(lambda: len(answers) == 2)
        assert [(n, disk) for n, _, _, disk in answers] == [("access-rows", [b"access-rows"]),
                                                            ("checkpoint", [b"access-rows", b"checkpoint"])]
        _close(writer, loop_task)

    asyncio.run(go())


def test_a_compaction_step_under_way_holds_up_no_batch(tmp_path):
    """Compaction has a thread of its own: a step of it (tens of ms on a big pass) running does
    not delay a batch of ASYNC records, nor the SYNC commits that would wait behind that batch."""
    async def go():
        writer = _writer(tmp_path, 2000)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        step = threading.Event()
        busy = asyncio.get_running_loop().run_in_executor(writer.compaction_io, step.wait, 30.0)
        answers: list = []
        _append(writer, answers, "access-rows", waiters=0)       # to the I/O thread: written at once
        await _until(lambda: len(answers) == 1, secs=10.0)       # (not after the 30 s step)
        _append(writer, answers, "checkpoint")                     # answered by the call
        assert not step.is_set()                                   # the compaction step is still going
        assert [(n, disk) for n, _, _, disk in answers] == [("access-rows", [b"access-rows"]),
                                                            ("checkpoint", [b"access-rows", b"checkpoint"])]
        step.set()
        await busy
        _close(writer, loop_task)

    asyncio.run(go())


def test_a_batch_waits_for_as_many_sync_records_as_the_last_one_held(tmp_path):
    async def go():
        writer = _writer(tmp_path, 10_000_000)       # a long window: only the count can end the wait early
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        answers: list = []
        _append(writer, answers, "a1 a2 a3", waiters=3)
        assert len(answers) == 1 and writer.last_waiters == 3
        _append(writer, answers, "b1")               # one of the three clients is back ...
        await asyncio.sleep(0.05)
        assert len(answers) == 1                     # ... so the batch waits for the other two
        _append(writer, answers, "b2")
        await asyncio.sleep(0.02)
        assert len(answers) == 1
        _append(writer, answers, "b3")
        assert [n for n, *_ in answers] == ["a1 a2 a3", "b1", "b2", "b3"]
        assert writer.stats["fsyncs"] == 2           # a1-a3 in one, b1-b3 in the other
        writer.window = 0.2
        _append(writer, answers, "c1")               # one alone: it waits the window out, then goes
        assert len(answers) == 4
        await _until(lambda: len(answers) == 5, secs=1.0)
        assert writer.stats["fsyncs"] == 3 and writer.last_waiters == 1
        _close(writer, loop_task)

    asyncio.run(go())


def test_a_log_configured_without_zeroing_appends_to_a_plain_segment(tmp_path):
    async def go():
        writer = _writer(tmp_path, 0, zero_segments=False)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        answers: list = []
        _append(writer, answers, "a b")
        assert [(n, disk) for n, _, _, disk in answers] == [("a b", [b"a", b"b"])]
        ((_, path),) = segments.list_segments(writer.directory)
        assert path.stat().st_size == writer.segments.end     # its records, no zeroed megabyte after them
        _close(writer, loop_task)

    asyncio.run(go())


def test_asked_only_for_its_end_a_writer_answers_with_where_its_log_is_durable(tmp_path):
    """writer/store's `sync` asks for the end alone, once per new session's first read: the answer
    is the durable end, and none of the rest of the stats is built for it."""
    from broker.protocol import Message

    async def go():
        writer = _writer(tmp_path, 0)
        await writer.open()
        loop_task = asyncio.create_task(writer.commit_loop())
        _append(writer, [], "a b", waiters=2)
        replies = []
        writer.bus.reply = lambda msg, kind, body: replies.append((kind, body))
        for body in ({"only_end": True}, {}):
            writer.on_stats(Message("writer/store", Kind.STATS, 7, 0.0, 0, "", "", body))
        _close(writer, loop_task)
        return writer.segments.end, replies

    end, replies = asyncio.run(go())
    assert end > 0
    assert replies[0] == (Kind.STATS_REPLY, {"role": "writer", "stats": {"end": end}})
    assert replies[1][1]["stats"]["end"] == end and replies[1][1]["stats"]["fsyncs"] == 1
