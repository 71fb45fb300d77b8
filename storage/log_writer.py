"""The writer/log role: the write-ahead log, with group commit.

Senders send `log.append` messages of framed-ready records. Everything that arrives while the
previous write+fdatasync runs becomes the next batch: one fdatasync per batch,
then one `log.ack` per message in it (group commit). With `storage.durability: none` a message
is acknowledged on receipt and nothing is fsync'd.

Records carry ids chosen by their senders; a re-sent record (its sender timed out, or this
process restarted before acknowledging it) is written once: recent ids are kept in memory and
re-read from the log's tail on start. A failed write (a full disk) truncates back to the last
whole batch and answers every waiting sender with an error instead of an ack.

With `storage.s3` set, every batch is also shipped to the bucket, and acks wait for the cluster
lease (storage/log_cluster.py).

The write and fdatasync run on the event loop's thread: what arrives meanwhile waits in the bus
socket and is the next batch. Opening and restoring run on the I/O thread, compaction on a
thread of its own (it only touches sealed segments and its marks).

Batching adapts to load (like PostgreSQL's commit_delay with commit_siblings): before an fsync,
the writer waits — at most `storage.commit_window_us` — until every sender that had a SYNC
record acknowledged in the last few milliseconds has a message in the batch: those senders got
their acks together and are about to send again. With a single SYNC sender nothing waits.

Embedded (`storage.gateway_log`): the gateway runs one of these in its own process for its own
records (checkpoint PUTs, access rows), as log `storage.log_writers`, so a PUT costs no process
hop. Appends arrive by a call (`LocalAppend`), from one sender that stands for many HTTP
clients, so the wait above counts records instead of senders: until the batch holds as many
SYNC records as the last one did (those clients got their answers together and are sending
again). Without that wait a batch held 2-3 of ten clients' checkpoints and the gateway's own log
gained nothing over writer/log; with it about 8, and 1.92× writer/log's checkpoints/s at 10k write
(bench/results/2026-12-01-compare-gateway-log/). A batch someone waits for is written and
fdatasync'd on the loop thread by the call that completes it (the log client makes one call per
loop iteration), and acknowledged by callbacks in that same call: no task sits between a PUT and
its answer. That took the 1-worker commit p50 from 0.75 to 0.65 ms and 10k checkpoints/s up
1.16× (write) and 1.26× (mixed) (bench/results/2026-12-02-put-callback-*-ab/). A batch of ASYNC
records only (access rows of other routes) goes to the I/O thread, so a slow disk never stalls
the gateway's streams for records nobody waits on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from agentos import cpu_layout, metrics, service
from agentos.config import Config
from agentos.rundir import RunDir
from broker.client import Bus
from broker.protocol import Kind, Message
from broker.sharding import log_writer
from storage import bucket_mending, compaction, compaction_helper, records, segments
from storage.log_cluster import ClusterSide
from storage.s3 import ObjectStore
from storage.shipper import Shipper
from storage.spares import IDLE_SECS
from broker.address import bus_address, direct_log_endpoint
from storage.log_inbox import LogInbox
from storage.recent_ids import RecentIds
from storage.slow_batches import SlowBatches
from storage.store_notices import StoreNotices
from storage.write_failures import WriteFailures

RECENT_SCAN_BYTES = 128 << 20
SPARE_CHECK_SECS = 0.25


class LocalAppend:
    """A `log.append` from the process this writer is embedded in (the gateway's own log): the
    same body as the message, answered by a call instead of a reply on the bus."""

    __slots__ = ("body", "answer", "waiters")
    src = "(local)"

    def __init__(self, body: dict, answer: Callable[[Kind, dict], None], waiters: int) -> None:
        self.body = body
        self.answer = answer
        self.waiters = waiters      # of its records, how many a caller is waiting on (SYNC)


class LogWriter(ClusterSide):
    def __init__(self, config: Config, index: int, bus_endpoint: str, log: logging.Logger,
                 embedded: bool = False) -> None:
        self.index = index
        self.embedded = embedded
        self.local_waiters = 0      # embedded: SYNC records in the batch being gathered ...
        self.last_waiters = 0       # ... and in the last one written
        self.window_timer: asyncio.TimerHandle | None = None   # embedded: the wait for more of them
        self.writing = False        # embedded: a batch of ASYNC records is on the I/O thread
        self.log = log
        self.fsync = config.storage.durability != "none"
        self.directory = Path(config.storage.dir) / "wal" / str(index)
        self.segment_bytes = config.storage.segment_bytes
        self.io = ThreadPoolExecutor(1, thread_name_prefix="wal-io", initializer=cpu_layout.background_thread)
        # Compaction's own thread: on the I/O thread, a pass's steps (tens of ms each) held up the
        # embedded log's batches of ASYNC records, and with them every SYNC commit after them.
        self.compaction_io = ThreadPoolExecutor(1, thread_name_prefix="wal-compact",
                                                initializer=cpu_layout.background_thread)
        self.rewriter = compaction_helper.Helper(f"log/{index}")   # the CPU-heavy half of compaction
        self.segments: segments.SegmentLog | None = None
        self.seen = RecentIds()
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
        self.config = config
        self.durability = config.storage.durability
        self.object_store = ObjectStore(config.storage.s3) if config.storage.s3.bucket else None
        self.shipper: Shipper | None = None
        self.lease_until = 0.0                      # monotonic; only used with a bucket
        self.lease_lost = False
        self.awaiting_ship: list[tuple[int, list]] = []
        self.held: list[tuple[list, int]] = []      # acks waiting for the lease to be renewed
        endpoint = direct_log_endpoint(bus_endpoint, index)
        self.inbox = LogInbox(log_writer(index), endpoint, self.on_append, log) if endpoint and not embedded else None
        self.tasks: list[asyncio.Task] = []
        self.segment_edits = asyncio.Lock()   # a compaction's rewrite, or a mend (storage/bucket_mending.py)
        self.damage_said: set[tuple[str, int]] = set()   # damaged records a compaction could not rewrite past
        self.bus = Bus(log_writer(index), bus_endpoint, {Kind.LOG_APPEND: self.on_append, Kind.STATS: self.on_stats,
                                                             Kind.LEASE: self.on_lease, Kind.LOG_MEND: self.on_mend,
                                                             Kind.LOG_LOADED: self.on_loaded},
                       role="writer", heartbeat_secs=config.broker.heartbeat_secs, log=log,
                       spill_bytes=config.broker.spill_ring_bytes)
        self.notices = StoreNotices(self.bus, index)
        self.slow = SlowBatches(log, str(self.directory))
        self.failures = WriteFailures(log)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self.segments = await loop.run_in_executor(self.io, segments.SegmentLog, self.directory, self.segment_bytes,
                                                   self.config.storage.zero_segments,
                                                   self.config.storage.spare_segments,
                                                   self.config.storage.min_free_bytes)
        self.segments.floor.count_store(Path(self.config.storage.dir) / "db")
        if self.object_store is not None:
            await self._level_with_bucket(loop)
        if not self.embedded:   # an embedded writer's one sender died with it: nobody retries into it
            ids = await loop.run_in_executor(self.io, segments.recent_ids, self.directory, RECENT_SCAN_BYTES)
            now = time.monotonic()   # ids from before a restart: their senders may still retry them
            for record_id in ids[-self.seen.cap:]:
                self.seen.add(record_id, now)
        r = self.segments.recovery
        self.log.info("log %s: %d segment(s), end at position %d, %d records in the last segment%s", self.directory,
                      r.segments, r.end, r.records_in_last,
                      f", truncated a torn tail of {r.truncated_bytes} bytes" if r.truncated_bytes else "")

    def on_loaded(self, msg: Message) -> None:
        if self.segments is not None:   # room for what writer/store has yet to load (storage/free_space.py)
            self.segments.floor.store_told(msg.body["behind"], msg.body.get("counted"), self.segments.end)

    def on_append(self, msg: Message) -> None:
        if self.lease_lost:
            self._refuse([(msg, 0)])
            return
        new = 0
        now = time.monotonic()
        for record in msg.body["records"]:   # all checked before any is taken: a refusal takes none
            if not (isinstance(record, list) and len(record) == 3 and record[0] in records.KNOWN_KINDS
                    and isinstance(record[1], bytes) and 0 < len(record[1]) <= 255 and isinstance(record[2], bytes)):
                self._reply(msg, Kind.ERROR, {"code": "bad_record", "message": "a record is not [kind, id, body]"})
                return
            if 2 + len(record[1]) + len(record[2]) > records.MAX_RECORD_BYTES:
                self._reply(msg, Kind.ERROR, {"code": "record_too_large", "message":
                                              f"a record is over the log's limit of {records.MAX_RECORD_BYTES:,} bytes"})
                return
        for kind, record_id, body in msg.body["records"]:
            if not self.embedded:
                # A call is never re-sent after it was written (a failed batch's ids are forgotten in
                # `_failed`), so only messages from other processes need de-duplicating.
                if record_id in self.seen:
                    self.stats["duplicates"] += 1
                    metrics.inc(metrics.log_duplicates)
                    continue
                self.seen.add(record_id, now)
            self.frames.append(records.frame(kind, record_id, body))
            self.frame_ids.append(record_id)
            new += 1
        if not self.embedded:
            self.seen.expire(now)
        self.stats["records"] += new
        self.unflushed += new
        metrics.inc(metrics.log_records, new)
        if self.fsync:
            self.waiting.append((msg, new))
            if self.embedded:
                self.local_waiters += msg.waiters
                self._embedded_appended()
                return
            self.expected.discard(msg.src)
            if not self.expected:
                self.enough.set()
        else:
            self._reply(msg, Kind.LOG_ACK, {"position": self.segments.end, "count": new})
        self.wake.set()

    async def commit_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not self.frames and not self.waiting:
                continue
            if self.embedded and not self.local_waiters:
                # Nobody waits on these: a slow disk must not stall the gateway's loop for them.
                batch = self._take()
                self.writing = True
                try:
                    end = await asyncio.get_running_loop().run_in_executor(self.io, self.segments.write, batch[0],
                                                                           self.fsync)
                except OSError as exc:
                    self._failed(batch[2], batch[1], sum(map(len, batch[0])), exc)
                    continue
                finally:
                    self.writing = False
                self._written(batch, end)
                continue
            if self.window and self.fsync and not self.embedded:
                await self._gather()
            self._commit()

    async def spare_loop(self) -> None:
        """Zero the log's spare segments while it is idle (storage/spares.py): IDLE_SECS without a
        batch, nothing on the I/O thread. With `storage.spare_segments: 1` there is nothing to do."""
        if self.config.storage.spare_segments <= 1 or not self.config.storage.zero_segments:
            return
        while True:
            await asyncio.sleep(SPARE_CHECK_SECS)
            if not self._busy():
                self.segments.refill(self._busy)

    def _busy(self) -> bool:
        """A batch within IDLE_SECS (or one on the I/O thread): spares wait (read from their thread too)."""
        return self.writing or time.monotonic() - self.segments.last_write_at < IDLE_SECS

    def _embedded_appended(self) -> None:
        """Embedded, durable: a batch someone waits on is written by this call, in the loop iteration
        its appends came in (the log client hands over once per iteration), so no task wakes for it
        and its callers hear in the same iteration. While it holds fewer SYNC records than the last
        batch did it waits for more, at most the commit window. A batch of ASYNC records only, or
        anything arriving while one is on the I/O thread, is commit_loop's."""
        if self.writing or not self.local_waiters:
            self.wake.set()
        elif self.window and self.local_waiters < self.last_waiters:
            if self.window_timer is None:
                self.window_timer = asyncio.get_running_loop().call_later(self.window, self._commit)
        else:
            self._commit()

    def _commit(self) -> None:
        """Write and fdatasync what is gathered, on the loop's thread, then acknowledge it.

        On the loop thread, not the I/O thread: on two busy cores the two thread hand-offs cost more
        than the overlap gains, and while the loop waits here the next batch collects in the sockets
        all the same. On the I/O thread, with no gathering wait and a 0.2 ms GIL switch interval,
        the gateway's log did 0.68× the checkpoints/s at 10k write
        (bench/results/2026-12-01-compare-gateway-fsync-thread/)."""
        if self.window_timer is not None:
            self.window_timer.cancel()
            self.window_timer = None
        if self.writing:
            self.wake.set()       # an ASYNC batch is on the I/O thread: commit_loop goes next
            return
        if not self.frames and not self.waiting:
            return
        batch = self._take()
        try:
            end = self.segments.write(batch[0], self.fsync)
        except OSError as exc:
            self._failed(batch[2], batch[1], sum(map(len, batch[0])), exc)
            return
        self._written(batch, end)

    def _take(self) -> tuple[list[bytes], list[bytes], list[tuple[Message, int]], int, float, int]:
        """The gathered batch: (frames, their ids, waiting messages, records, started, first segment)."""
        data, self.frames = self.frames, []
        ids, self.frame_ids = self.frame_ids, []
        waiting, self.waiting = self.waiting, []
        count, self.unflushed = self.unflushed, 0
        waiters, self.local_waiters = self.local_waiters, 0
        if waiters or not self.embedded:
            self.last_waiters = waiters
        return data, ids, waiting, count, time.monotonic(), self.segments.start

    def _written(self, batch: tuple, end: int) -> None:
        data, _, waiting, count, started, segment_before = batch
        done = time.monotonic()
        self.failures.succeeded()
        if self.durability != "s3":
            # first: in the gateway the acks are its answers to the clients; the counting can wait
            self._acknowledge(waiting, end)
        size = sum(map(len, data))
        self.stats["batches"] += 1
        self.stats["bytes"] += size
        metrics.inc(metrics.log_bytes, size)
        if self.fsync:
            self.stats["fsyncs"] += 1
            metrics.inc(metrics.log_fsyncs)
            elapsed = done - started
            metrics.observe(metrics.log_fsync_ms, elapsed * 1000.0)
            metrics.observe(metrics.log_batch_records, sum(n for _, n in waiting))
            self.slow.check(elapsed, self.segments.last_phases, count, size)
        self.notices.written(end, count)
        if self.shipper is not None and size:
            self.shipper.submit(end - size, end, b"".join(data), new_segment=self.segments.start != segment_before)
        if self.durability == "s3":
            self.awaiting_ship.append((end, waiting))  # acknowledged once the bucket has it

    def _acknowledge(self, waiting: list[tuple[Message, int]], end: int) -> None:
        if self.lease_lost:
            self._refuse(waiting)
            return
        if self.durability == "s3" and not self._active():
            self._hold(waiting, end)  # the lease could not be renewed yet: wait for it
            return
        acked_at = time.monotonic()
        remember = not self.embedded    # an embedded log batches by record count, not by sender
        for msg, n in waiting:
            self._reply(msg, Kind.LOG_ACK, {"position": end, "count": n})
            if remember and msg.body.get("sync"):
                self.sync_senders[msg.src] = acked_at

    async def _gather(self) -> None:
        now = time.monotonic()
        # "About to send again": acked within the window this fsync may wait (5 ms at least).
        recent = {s for s, t in self.sync_senders.items() if now - t < max(0.005, self.window)}
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

    def _failed(self, waiting: list[tuple[Message, int]], ids: list[bytes], size: int, exc: OSError) -> None:
        """Nothing of a failed batch is acknowledged; its senders learn at once."""
        self.stats["errors"] += 1
        code = self.failures.failed(size, exc, len(waiting))
        for record_id in ids:
            self.seen.discard(record_id)  # not written: the senders' retries must get in
        for msg, _ in waiting:
            self._reply(msg, Kind.ERROR, {"code": code, "message": f"log write failed: {exc.strerror}"})

    def _reply(self, msg: Message | LocalAppend, kind: Kind, body: dict) -> None:
        """On the path the append came by: a call, the direct inbox, or the broker."""
        if type(msg) is LocalAppend:
            msg.answer(kind, body)
        elif self.inbox is None or not self.inbox.reply(msg, kind, body, self.bus.new_id()):
            self.bus.reply(msg, kind, body)

    async def on_mend(self, msg: Message) -> None:
        await bucket_mending.on_mend(self, msg)

    def on_stats(self, msg: Message) -> None:
        if msg.body.get("only_end"):    # writer/store's `sync`, once per read of a new session: cheap
            self.bus.reply(msg, Kind.STATS_REPLY, {"role": "writer", "stats": {
                "end": self.segments.end if self.segments else 0}})
            return
        shipper = self.shipper.stats if self.shipper else {}
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "writer", "stats": {
            **self.stats, "s3": {**shipper, "shipped": self.shipper.shipped if self.shipper else None,
                                 "pending_bytes": self.shipper.pending_bytes if self.shipper else 0,
                                 "failing": bool(self.shipper and self.shipper.failing_since)},
            "active": self._active(), "queued_records": len(self.frames), "waiting_messages": len(self.waiting),
            "end": self.segments.end if self.segments else 0, "fsync": self.fsync, "bus": self.bus.stats(),
            "direct": {"received": self.inbox.received, "malformed": self.inbox.malformed} if self.inbox else None}})

    async def start(self) -> None:
        """Open the log, join the bus, and run the commit and compaction loops."""
        await self.open()
        await self.bus.start()
        if self.inbox is not None:
            await self.inbox.open()
        self.tasks = [service.lifelong(self.commit_loop()), service.lifelong(compaction.compaction_loop(self)),
                      service.lifelong(self.spare_loop())]

    async def stop(self) -> None:
        """Finish what was received: every message that got here is written before this returns."""
        self.wake.set()
        await asyncio.sleep(0)
        while self.frames or self.waiting:
            await asyncio.sleep(0.01)
        for task in self.tasks:
            task.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self.compaction_io.shutdown)   # a step under way ends
        await asyncio.get_running_loop().run_in_executor(None, self.rewriter.close)
        if self.shipper is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.shipper.stop)
        if self.inbox is not None:
            self.inbox.close()
        self.notices.close()
        await self.bus.close()
        self.io.submit(self.segments.close).result()
        self.io.shutdown()


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    async def run(stop: asyncio.Event) -> int:
        writer = LogWriter(config, index, bus_address(config, run_dir), log)
        await writer.start()
        await stop.wait()
        await writer.stop()
        return service.EXIT_OK

    return service.run(run)
