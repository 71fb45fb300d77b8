"""Shipping the write-ahead log to the bucket, on threads of the log writer.

Batches are queued in log order. Up to `storage.s3.max_inflight_puts` PUTs are in flight at
once; batches that arrive meanwhile accumulate, and the next PUT carries all of them (so under
load one object holds the commits of many flows). `shipped` only moves over the contiguous
prefix of what the bucket has: a batch is acknowledged (in `s3` mode) once every byte before it
is there too, so a node restoring from the bucket never finds a gap below an acknowledged
record. A PUT that fails is retried with back-off until the bucket answers again.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from agentos import cpu_layout, metrics
from storage.s3 import ObjectStore, S3Unavailable

MAX_PUT_BYTES = 16 << 20


class Shipper:
    def __init__(self, store: ObjectStore, writer: int, epoch: int, shipped: int,
                 on_shipped: Callable[[int], None], log: logging.Logger, max_inflight: int = 1) -> None:
        self.store = store
        self.writer = writer
        self.epoch = epoch
        self.shipped = shipped
        self.on_shipped = on_shipped          # called on a shipper thread with the new contiguous end
        self.log = log
        self.max_inflight = max_inflight
        self.queue: collections.deque[tuple[int, int, bytes, bool]] = collections.deque()
        self.inflight: dict[int, int] = {}    # start -> end of PUTs in flight
        self.landed: dict[int, int] = {}      # start -> end of PUTs done beyond the contiguous prefix
        self.cond = threading.Condition()
        self.stopping = False
        self.failing_since = 0.0
        self.stats = {"puts": 0, "bytes": 0, "batches": 0, "errors": 0}
        self.pool = ThreadPoolExecutor(max_inflight, thread_name_prefix=f"put-{writer}",
                                       initializer=cpu_layout.background_thread)
        self.thread = threading.Thread(target=self.run, name=f"shipper-{writer}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, start: int, end: int, data: bytes, new_segment: bool = False) -> None:
        """Queue [start, end); `new_segment`: it opens a local segment (an object never spans two,
        so compaction can replace a segment's objects without touching its neighbours')."""
        with self.cond:
            self.queue.append((start, end, data, new_segment))
            self.cond.notify()

    def stop(self, drain_secs: float = 5.0) -> None:
        deadline = time.monotonic() + drain_secs
        while (self.queue or self.inflight) and time.monotonic() < deadline and not self.failing_since:
            time.sleep(0.01)
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    @property
    def pending_bytes(self) -> int:
        return sum(len(d) for _, _, d, _ in list(self.queue))

    def _take(self) -> tuple[int, int, bytes, int]:
        """As many queued batches as fit in one object: (start, end, data, batch count)."""
        start, end, parts, size = self.queue[0][0], self.queue[0][0], [], 0
        count = 0
        for batch_start, batch_end, data, new_segment in self.queue:
            if batch_start != end or (parts and (new_segment or size + len(data) > MAX_PUT_BYTES)):
                break
            parts.append(data)
            size += len(data)
            end = batch_end
            count += 1
        for _ in range(count):
            self.queue.popleft()
        return start, end, b"".join(parts), count

    def run(self) -> None:
        cpu_layout.background_thread()
        while True:
            with self.cond:
                while not self.stopping and (not self.queue or len(self.inflight) >= self.max_inflight):
                    self.cond.wait()
                if self.stopping:
                    return
                start, end, data, count = self._take()
                self.inflight[start] = end
            self.pool.submit(self._put, start, end, data, count)

    def _put(self, start: int, end: int, data: bytes, count: int) -> None:
        """One object, retried until the bucket takes it."""
        backoff = 0.2
        while True:
            began = time.monotonic()
            try:
                self.store.put_batch(self.writer, start, end, self.epoch, data)
                break
            except S3Unavailable as exc:
                self.stats["errors"] += 1
                metrics.s3_errors.inc()
                if not self.failing_since:
                    self.failing_since = time.monotonic()
                    metrics.s3_unavailable.set(1)
                    self.log.error("object storage unavailable (%s); %d bytes wait to be shipped, retrying",
                                   exc, self.pending_bytes + len(data))
                with self.cond:
                    if self.stopping:
                        return
                    self.cond.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if self.failing_since:
            self.log.warning("object storage is back after %.1fs; shipping resumes",
                             time.monotonic() - self.failing_since)
            self.failing_since = 0.0
            metrics.s3_unavailable.set(0)
        self.stats["puts"] += 1
        self.stats["bytes"] += len(data)
        self.stats["batches"] += count
        metrics.s3_put_ms.observe((time.monotonic() - began) * 1000.0)
        metrics.s3_bytes.inc(len(data))
        metrics.s3_batches_per_put.observe(count)
        with self.cond:
            del self.inflight[start]
            self.landed[start] = end
            advanced = False
            while self.shipped in self.landed:
                self.shipped = self.landed.pop(self.shipped)
                advanced = True
            shipped = self.shipped
            self.cond.notify_all()
        if advanced:
            self.on_shipped(shipped)
