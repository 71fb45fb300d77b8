"""Shipping the write-ahead log to the bucket, on a thread of the log writer.

Batches are queued in log order; while one PUT is in flight the next ones accumulate, and the
next PUT carries all of them (so under load one object holds the commits of many flows). A PUT
that fails is retried with back-off until the bucket answers again — nothing is skipped, so
`shipped` only ever moves forward over bytes that are in the bucket.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from agentos import metrics
from storage.s3 import ObjectStore, S3Unavailable

MAX_PUT_BYTES = 16 << 20


class Shipper:
    def __init__(self, store: ObjectStore, writer: int, epoch: int, shipped: int,
                 on_shipped: Callable[[int], None], log: logging.Logger) -> None:
        self.store = store
        self.writer = writer
        self.epoch = epoch
        self.shipped = shipped
        self.on_shipped = on_shipped          # called on the shipper thread with the new end
        self.log = log
        self.queue: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.failing_since = 0.0
        self.stats = {"puts": 0, "bytes": 0, "batches": 0, "errors": 0}
        self.thread = threading.Thread(target=self.run, name=f"shipper-{writer}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, start: int, end: int, data: bytes) -> None:
        with self.cond:
            self.queue.append((start, end, data))
            self.cond.notify()

    def stop(self, drain_secs: float = 5.0) -> None:
        deadline = time.monotonic() + drain_secs
        while self.queue and time.monotonic() < deadline and not self.failing_since:
            time.sleep(0.01)
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=5)

    @property
    def pending_bytes(self) -> int:
        return sum(len(d) for _, _, d in list(self.queue))

    def _take(self) -> tuple[int, int, bytes, int]:
        """As many queued batches as fit in one object: (start, end, data, batch count)."""
        start, end, parts, size = self.queue[0][0], self.queue[0][0], [], 0
        count = 0
        for batch_start, batch_end, data in self.queue:
            if batch_start != end or (parts and size + len(data) > MAX_PUT_BYTES):
                break
            parts.append(data)
            size += len(data)
            end = batch_end
            count += 1
        return start, end, b"".join(parts), count

    def run(self) -> None:
        backoff = 0.2
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                start, end, data, count = self._take()
            began = time.monotonic()
            try:
                self.store.put_batch(self.writer, start, end, self.epoch, data)
            except S3Unavailable as exc:
                self.stats["errors"] += 1
                metrics.s3_errors.inc()
                if not self.failing_since:
                    self.failing_since = time.monotonic()
                    metrics.s3_unavailable.set(1)
                    self.log.error("object storage unavailable (%s); %d bytes wait to be shipped, retrying",
                                   exc, self.pending_bytes)
                with self.cond:
                    self.cond.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self.failing_since:
                self.log.warning("object storage is back after %.1fs; shipping resumes",
                                 time.monotonic() - self.failing_since)
                self.failing_since = 0.0
                metrics.s3_unavailable.set(0)
            backoff = 0.2
            with self.cond:
                for _ in range(count):
                    self.queue.popleft()
            self.shipped = end
            self.stats["puts"] += 1
            self.stats["bytes"] += len(data)
            self.stats["batches"] += count
            metrics.s3_requests.labels("put", "wal").inc()
            metrics.s3_put_ms.observe((time.monotonic() - began) * 1000.0)
            metrics.s3_bytes.inc(len(data))
            metrics.s3_batches_per_put.observe(count)
            self.on_shipped(end)
