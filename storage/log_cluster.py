"""A log writer's side of a cluster: the bucket its batches are shipped to, and the lease it
acknowledges under (a part of `storage.log_writer.LogWriter`, kept apart to keep each readable).

With `storage.s3` set, every batch is also shipped to the bucket (storage/shipper.py); with
`storage.durability: s3` an ack waits for the PUT that carries its batch. A writer acknowledges
only while its node holds the cluster lease: the supervisor tells it after each renewal how long
that is (`ctl.lease`). If a renewal cannot reach the bucket, `s3`-durable acks wait until one
does (`local` ones go on: that mode never promised more than this node's disk); once the lease is
known to be taken, every append is refused with `not_active` (fencing). On start it
brings the local log level with the bucket: what only the bucket has (an empty disk after a
failover) is written back locally, what only the disk has is shipped.
"""
from __future__ import annotations

import asyncio
import time

from agentos import metrics
from broker.protocol import Kind, Message
from storage import bucket_restore
from storage.s3 import S3Unavailable
from storage.shipper import Shipper


class ClusterSide:
    """Methods of LogWriter; the state they use (`object_store`, `shipper`, `lease_until`,
    `lease_lost`, `awaiting_ship`, `held`) is set up in its `__init__`."""

    async def _level_with_bucket(self, loop: asyncio.AbstractEventLoop) -> None:
        """Restore from the bucket what the disk lacks; queue for shipping what the bucket lacks."""
        while True:
            try:
                chain = await loop.run_in_executor(self.io, self.object_store.chain, self.index)
                lease = await loop.run_in_executor(self.io, self.object_store.read_lease)
                break
            except S3Unavailable as exc:
                self.log.error("object storage unavailable at start (%s); retrying", exc)
                await asyncio.sleep(1.0)
        bucket_end = chain[-1].end if chain else 0
        local_end = self.segments.end
        if local_end < bucket_end:
            await self._restore(loop, chain)
        cluster = self.config.cluster
        if lease is not None and lease.node == cluster.node_id and lease.epoch == cluster.epoch:
            self.lease_until = time.monotonic() + (lease.expires_at - time.time()) - 1.0
        self.shipper = Shipper(self.object_store, self.index, cluster.epoch, max(bucket_end, local_end if
                               local_end <= bucket_end else bucket_end), self._shipped_threadsafe, self.log,
                               self.config.storage.s3.max_inflight_puts)
        self.shipper.start()
        if self.segments.end > bucket_end:
            data = await loop.run_in_executor(self.io, self.segments.read_range, bucket_end, self.segments.end)
            self.shipper.submit(bucket_end, self.segments.end, data)

    async def _restore(self, loop: asyncio.AbstractEventLoop, chain: list) -> None:
        """Write back what only the bucket has; the bucket going away part way is waited out,
        and the restore goes on from where it got (what it wrote stays)."""
        local_end = self.segments.end
        while True:
            try:
                await loop.run_in_executor(self.io, bucket_restore.restore, self.segments, self.object_store,
                                           chain, self.segments.end)
                break
            except S3Unavailable as exc:
                self.log.error("object storage unavailable while restoring log %d (%s); %d of %d bytes "
                               "restored, retrying", self.index, exc, self.segments.end - local_end,
                               chain[-1].end - local_end)
                await asyncio.sleep(1.0)
        self.log.info("restored %d bytes of log %d from the bucket (%d objects)", self.segments.end - local_end,
                      self.index, sum(1 for batch in chain if batch.end > local_end))

    def _shipped_threadsafe(self, end: int) -> None:
        self.bus._loop.call_soon_threadsafe(self._shipped, end)

    def _shipped(self, end: int) -> None:
        """A PUT succeeded: acknowledge the `s3`-durable batches it covered."""
        done = [entry for entry in self.awaiting_ship if entry[0] <= end]
        if not done:
            return
        self.awaiting_ship = [entry for entry in self.awaiting_ship if entry[0] > end]
        for batch_end, waiting in done:
            self._acknowledge(waiting, batch_end)
            metrics.inc(metrics.s3_synced_records, sum(n for _, n in waiting))

    def on_lease(self, msg: Message) -> None:
        valid = float(msg.body["valid_secs"])
        if msg.body["epoch"] != self.config.cluster.epoch or valid <= 0:
            if not self.lease_lost:
                self.log.error("the cluster lease is lost: refusing every append from now on")
            self.lease_lost = True
            self.lease_until = 0.0
            held, self.held = self.held, []
            for waiting, _ in held:
                self._refuse(waiting)
            return
        self.lease_until = time.monotonic() + valid
        held, self.held = self.held, []
        if held:   # said: from outside, a pause of every ack with nothing failing (a stalled supervisor)
            self.log.warning("acknowledgements held %.1f s for the cluster lease's renewal (%d batches), "
                             "acknowledged now", time.monotonic() - self.held_since, len(held))
        for waiting, end in held:
            self._acknowledge(waiting, end)

    def _hold(self, waiting: list[tuple[Message, int]], end: int) -> None:
        """Acks of a batch written while this writer's permission had run out: until a renewal."""
        if not self.held:
            self.held_since = time.monotonic()
        self.held.append((waiting, end))

    def _active(self) -> bool:
        return self.object_store is None or time.monotonic() < self.lease_until

    def _refuse(self, waiting: list[tuple[Message, int]]) -> None:
        for msg, _ in waiting:
            self._reply(msg, Kind.ERROR, {"code": "not_active", "message":
                           "this node lost the cluster lease: another node is active"})
