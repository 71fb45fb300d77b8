"""The cluster lease, held by the supervisor of the active node.

With `storage.s3` set, a node serves only while it holds the lease object in the bucket. The
supervisor takes it before starting the process tree (waiting as a standby while another live
node holds it), renews it every `cluster.lease_renew_secs` with a conditional write, and tells the
log writers after each renewal how long they may acknowledge. If a renewal finds the lease taken,
the node stops at once; if the bucket cannot be reached, the writers' permission simply runs out
and acknowledgements pause until a renewal succeeds.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from typing import Awaitable, Callable

from agentos import metrics
from agentos.config import Config
from storage.s3 import Lease, LeaseLost, ObjectStore, S3Unavailable

SAFETY_SECS = 1.0   # a writer stops acknowledging this long before the lease could expire
log = logging.getLogger("agent-os.supervisor")


def node_id(config: Config) -> str:
    return config.cluster.node_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class LeaseKeeper:
    def __init__(self, config: Config, store: ObjectStore | None = None) -> None:
        self.config = config
        self.store = store or ObjectStore(config.storage.s3)
        self.node = config.cluster.node_id
        self.lease: Lease | None = None

    async def acquire(self, stop: asyncio.Event, standby: bool) -> bool:
        """Wait until this node holds the lease; False if asked to stop first."""
        cluster = self.config.cluster
        announced = None
        while not stop.is_set():
            try:
                before = await asyncio.to_thread(self.store.read_lease)
                lease = await asyncio.to_thread(self.store.acquire, self.node, cluster.lease_ttl_secs)
            except (S3Unavailable, LeaseLost) as exc:
                log.warning("cannot take the cluster lease yet: %s", exc)
                lease = None
                before = None
            if lease is not None:
                self.lease = lease
                metrics.lease_epoch.set(lease.epoch)
                if before is not None and before.node != self.node and before.expires_at > 0:
                    metrics.failovers.inc()
                    log.warning("took over the cluster lease from %s (epoch %d -> %d)", before.node, before.epoch,
                                lease.epoch)
                else:
                    log.info("holding the cluster lease (epoch %d) as node %s", lease.epoch, self.node)
                return True
            if before is not None and announced != (before.node, before.epoch):
                announced = (before.node, before.epoch)
                log.info("%s: node %s holds the cluster lease (epoch %d) for %.1fs more; watching it",
                         "standby" if standby else "waiting", before.node, before.epoch,
                         max(0.0, before.expires_at - time.time()))
            try:
                await asyncio.wait_for(stop.wait(), min(cluster.lease_renew_secs, 1.0))
            except asyncio.TimeoutError:
                pass
        return False

    async def keep(self, on_renewed: Callable[[int, float], None], on_lost: Callable[[], Awaitable[None]]) -> None:
        """Renew until the lease is lost (then `on_lost`) or this task is cancelled."""
        cluster = self.config.cluster
        again = False
        while True:
            if not again:
                await asyncio.sleep(cluster.lease_renew_secs)
            again = False
            began = time.monotonic()
            try:
                self.lease = await asyncio.to_thread(self.store.write_lease, self.node, self.lease.epoch,
                                                     cluster.lease_ttl_secs, self.lease.etag)
            except LeaseLost:
                on_renewed(self.lease.epoch, 0.0)   # the writers first: they refuse from their next append
                log.error("the cluster lease was taken by another node: this node stops acknowledging now")
                metrics.lease_epoch.set(0)
                await on_lost()
                return
            except S3Unavailable as exc:
                log.warning("lease renewal failed (%s); writers pause when the lease runs out", exc)
                continue
            metrics.lease_renewals.inc()
            took = time.monotonic() - began
            valid = cluster.lease_ttl_secs - took - SAFETY_SECS
            if valid <= 0:
                # Renewed, but so slowly (a starved machine, a slow bucket) that it leaves no
                # permission: renewed again at once. Told as 0 s, the writers took the lease for
                # lost and refused every append for good (a renewal after a 5 s stall, under load).
                log.warning("the lease renewal took %.1f s, leaving no time to acknowledge in; renewing again",
                            took)
                again = True
                continue
            on_renewed(self.lease.epoch, valid)

    async def release(self) -> None:
        if self.lease is not None:
            try:
                await asyncio.to_thread(self.store.release, self.lease)
            except S3Unavailable:
                pass
            self.lease = None
            metrics.lease_epoch.set(0)
