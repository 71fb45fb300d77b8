"""The writer/log role: the write-ahead log, with group commit.

Senders send `log.append` messages of framed-ready records. Everything that arrives while the
previous write+fdatasync runs on the I/O thread becomes the next batch: one fdatasync per batch,
then one `log.ack` per message in it (group commit). With `storage.durability: none` a message
is acknowledged on receipt and nothing is fsync'd.

Records carry ids chosen by their senders; a re-sent record (its sender timed out, or this
process restarted before acknowledging it) is written once: recent ids are kept in memory and
re-read from the log's tail on start. A failed write (a full disk) truncates back to the last
whole batch and answers every waiting sender with an error instead of an ack.

Batching adapts to load (like PostgreSQL's commit_delay with commit_siblings): before an fsync,
the writer waits — at most `storage.commit_window_us` — until every sender that had a SYNC
record acknowledged in the last few milliseconds has a message in the batch: those senders got
their acks together and are about to send again. With a single SYNC sender nothing waits.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentos import metrics, service
from agentos.config import Config
from agentos.rundir import RunDir
from broker.client import Bus
from broker.protocol import Kind, Message
from broker.sharding import STORE
from storage import records, segments

RECENT_IDS = 500_000
RECENT_SCAN_BYTES = 128 << 20


class LogWriter:
    def __init__(self, config: Config, index: int, bus_endpoint: str, log: logging.Logger) -> None:
        self.index = index
        self.log = log
        self.fsync = config.storage.durability != "none"
        self.directory = Path(config.storage.dir) / "wal" / str(index)
        self.segment_bytes = config.storage.segment_bytes
        self.io = ThreadPoolExecutor(1, thread_name_prefix="wal-io")
        self.segments: segments.SegmentLog | None = None
        self.seen: set[bytes] = set()
        self.seen_order: collections.deque[bytes] = collections.deque()
        self.frames: list[bytes] = []
        self.frame_ids: list[bytes] = []
        self.waiting: list[tuple[Message, int]] = []
        self.unflushed = 0
        self.wake = asyncio.Event()
        self.enough = asyncio.Event()
        self.sync_senders: dict[str, float] = {}   # sender -> when its last SYNC message was acked
        self.expected: set[str] = set()            # senders the next fsync waits for
        self.window = config.storage.commit_window_us / 1e6
        self.stats = {"records": 0, "duplicates": 0, "batches": 0, "fsyncs": 0, "bytes": 0, "errors": 0}
        self.bus = Bus(f"writer/log/{index}", bus_endpoint, {Kind.LOG_APPEND: self.on_append, Kind.STATS: self.on_stats},
                       role="writer", heartbeat_secs=config.broker.heartbeat_secs, log=log)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self.segments = await loop.run_in_executor(self.io, segments.SegmentLog, self.directory, self.segment_bytes)
        ids = await loop.run_in_executor(self.io, segments.recent_ids, self.directory, RECENT_SCAN_BYTES)
        for record_id in ids[-RECENT_IDS:]:
            self._remember(record_id)
        r = self.segments.recovery
        self.log.info("log %s: %d segment(s), end at position %d, %d records in the last segment%s", self.directory,
                      r.segments, r.end, r.records_in_last,
                      f", truncated a torn tail of {r.truncated_bytes} bytes" if r.truncated_bytes else "")

    def _remember(self, record_id: bytes) -> None:
        self.seen.add(record_id)
        self.seen_order.append(record_id)
        if len(self.seen_order) > RECENT_IDS:
            self.seen.discard(self.seen_order.popleft())

    def on_append(self, msg: Message) -> None:
        new = 0
        for record in msg.body["records"]:
            if not (isinstance(record, list) and len(record) == 3 and record[0] in records.KNOWN_KINDS
                    and isinstance(record[1], bytes) and 0 < len(record[1]) <= 255 and isinstance(record[2], bytes)):
                self.bus.reply(msg, Kind.ERROR, {"code": "bad_record", "message": "a record is not [kind, id, body]"})
                return
            kind, record_id, body = record
            if record_id in self.seen:
                self.stats["duplicates"] += 1
                metrics.inc(metrics.log_duplicates)
                continue
            self._remember(record_id)
            self.frames.append(records.frame(kind, record_id, body))
            self.frame_ids.append(record_id)
            new += 1
        self.stats["records"] += new
        self.unflushed += new
        metrics.inc(metrics.log_records, new)
        if self.fsync:
            self.waiting.append((msg, new))
            self.expected.discard(msg.src)
            if not self.expected:
                self.enough.set()
        else:
            self.bus.reply(msg, Kind.LOG_ACK, {"position": self.segments.end, "count": new})
        self.wake.set()

    async def commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not self.frames and not self.waiting:
                continue
            if self.window and self.fsync:
                await self._gather()
            data, self.frames = b"".join(self.frames), []
            ids, self.frame_ids = self.frame_ids, []
            waiting, self.waiting = self.waiting, []
            count = self.unflushed
            self.unflushed = 0
            started = time.monotonic()
            try:
                end = await loop.run_in_executor(self.io, self.segments.write, data, self.fsync)
            except OSError as exc:
                self._failed(waiting, ids, data, exc)
                continue
            self.stats["batches"] += 1
            self.stats["bytes"] += len(data)
            metrics.inc(metrics.log_bytes, len(data))
            if self.fsync:
                self.stats["fsyncs"] += 1
                metrics.inc(metrics.log_fsyncs)
                metrics.observe(metrics.log_fsync_ms, (time.monotonic() - started) * 1000.0)
                metrics.observe(metrics.log_batch_records, sum(n for _, n in waiting))
            self.bus.send(STORE, Kind.LOG_FLUSHED, {"writer": self.index, "position": end, "count": count})
            acked_at = time.monotonic()
            for msg, n in waiting:
                self.bus.reply(msg, Kind.LOG_ACK, {"position": end, "count": n})
                if msg.body.get("sync"):
                    self.sync_senders[msg.src] = acked_at

    async def _gather(self) -> None:
        now = time.monotonic()
        recent = {s for s, t in self.sync_senders.items() if now - t < 0.005}
        if len(self.sync_senders) > 1000:
            self.sync_senders = {s: self.sync_senders[s] for s in recent}
        self.expected = recent - {msg.src for msg, _ in self.waiting}
        if not self.expected:
            return
        self.enough.clear()
        try:
            await asyncio.wait_for(self.enough.wait(), self.window)
        except asyncio.TimeoutError:
            pass
        self.expected = set()

    def _failed(self, waiting: list[tuple[Message, int]], ids: list[bytes], data: bytes, exc: OSError) -> None:
        """Nothing of a failed batch is acknowledged; its senders learn at once."""
        self.stats["errors"] += 1
        metrics.log_write_errors.inc()
        code = "disk_full" if exc.errno == 28 else "io_error"
        self.log.error("log write of %d bytes failed (%s): %s; answering %d senders with an error",
                       len(data), code, exc.strerror, len(waiting))
        for record_id in ids:
            self.seen.discard(record_id)  # not written: the senders' retries must get in
        for msg, _ in waiting:
            self.bus.reply(msg, Kind.ERROR, {"code": code, "message": f"log write failed: {exc.strerror}"})

    def on_stats(self, msg: Message) -> None:
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "writer", "stats": {
            **self.stats, "queued_records": len(self.frames), "waiting_messages": len(self.waiting),
            "end": self.segments.end if self.segments else 0, "fsync": self.fsync, "bus": self.bus.stats()}})


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    async def run(stop: asyncio.Event) -> int:
        writer = LogWriter(config, index, run_dir.bus_endpoint, log)
        await writer.open()
        await writer.bus.start()
        committer = asyncio.create_task(writer.commit_loop())
        await stop.wait()
        # Finish what was received: every message that got here is written before we exit.
        writer.wake.set()
        await asyncio.sleep(0)
        while writer.frames or writer.waiting:
            await asyncio.sleep(0.01)
        committer.cancel()
        await writer.bus.close()
        writer.io.submit(writer.segments.close).result()
        writer.io.shutdown()
        return service.EXIT_OK

    return service.run(run)
