"""Provider permits: at most `limit` model calls at once across all actors.

Pure logic, no I/O, so it is unit-tested without processes. Grants go in FIFO order within a
tenant and round-robin between tenants, so one busy tenant cannot starve the others; a waiter
with a lower `priority` number goes before all with higher ones (flow queues' runs may have one;
provider permits are all 0). Every method returns the grants it made as (holder, permit_id)
pairs for the caller to send.

Holders (actor processes) report what they hold and wait for in a periodic sync. The pool
trusts those reports: a permit the holder no longer lists is released (after a short grace, in
case the grant is still in flight), a permit it lists that the pool does not know is adopted
(the scheduler restarted), and a new incarnation of a holder drops everything of the old one.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

Grant = tuple[str, str]  # (holder, permit_id)


@dataclass(slots=True)
class _Waiter:
    permit_id: str
    holder: str
    tenant: str
    since: float
    priority: int = 0


@dataclass
class PermitPool:
    limit: int
    grace_secs: float = 2.0
    holder_timeout_secs: float = 15.0
    held: dict[str, tuple[str, float, str]] = field(default_factory=dict)   # permit -> (holder, granted at, tenant)
    waiting: dict[str, _Waiter] = field(default_factory=dict)
    queues: dict[tuple[int, str], collections.deque] = field(default_factory=dict)   # (priority, tenant) -> waiters
    rotations: dict[int, collections.deque] = field(default_factory=dict)  # priority -> its tenants with waiters
    paused_until: float = 0.0
    incarnations: dict[str, int] = field(default_factory=dict)
    last_sync: dict[str, float] = field(default_factory=dict)
    granted_total: int = 0

    def request(self, permit_id: str, holder: str, tenant: str, now: float, priority: int = 0) -> list[Grant]:
        held = self.held.get(permit_id)
        if held is not None:
            return [(held[0], permit_id)]  # a re-sent request: the grant may have been lost
        if permit_id in self.waiting:
            return []
        waiter = _Waiter(permit_id, holder, tenant, now, priority)
        self.waiting[permit_id] = waiter
        queue = self.queues.get((priority, tenant))
        if queue is None:
            queue = self.queues[(priority, tenant)] = collections.deque()
            self.rotations.setdefault(priority, collections.deque()).append(tenant)
        queue.append(waiter)
        self.last_sync[holder] = now
        return self._grant(now)

    def release(self, permit_id: str, now: float, backoff_secs: float = 0.0) -> list[Grant]:
        if self.held.pop(permit_id, None) is None:
            self._unqueue(permit_id)
        if backoff_secs > 0:
            self.paused_until = max(self.paused_until, now + backoff_secs)
        return self._grant(now)

    def sync(self, holder: str, incarnation: int, held: list[str], waiting: list[str], now: float,
             backoff_secs: float = 0.0, tenants: dict[str, str] | None = None) -> list[Grant]:
        """`backoff_secs`: what is left of the holder's last back-off, repeated until it ends, so a
        release that carried it and was lost (or a scheduler restart) does not cut the pause short.
        `tenants`: whose each held permit is, where the holder says (for one adopted here)."""
        if backoff_secs > 0:
            self.paused_until = max(self.paused_until, now + backoff_secs)
        previous = self.incarnations.get(holder)
        self.incarnations[holder] = incarnation
        self.last_sync[holder] = now
        if previous is not None and previous != incarnation:
            self._drop(holder, now, grace=0.0)
        listed = set(held)
        for permit_id, (owner, granted_at, _) in list(self.held.items()):
            if owner == holder and permit_id not in listed and now - granted_at > self.grace_secs:
                del self.held[permit_id]
        for permit_id in listed:
            if permit_id not in self.held:
                self._unqueue(permit_id)
                # adopted after a scheduler restart
                self.held[permit_id] = (holder, now, (tenants or {}).get(permit_id, ""))
        still_waiting = set(waiting)
        for permit_id, waiter in list(self.waiting.items()):
            if waiter.holder == holder and permit_id not in still_waiting and now - waiter.since > self.grace_secs:
                self._unqueue(permit_id)
        return self._grant(now)

    def tick(self, now: float) -> list[Grant]:
        """Expire silent holders and resume after a back-off."""
        for holder, seen in list(self.last_sync.items()):
            if now - seen > self.holder_timeout_secs:
                del self.last_sync[holder]
                self._drop(holder, now, grace=0.0)
        return self._grant(now)

    def _drop(self, holder: str, now: float, grace: float) -> None:
        for permit_id, (owner, granted_at, _) in list(self.held.items()):
            if owner == holder and now - granted_at >= grace:
                del self.held[permit_id]
        for permit_id, waiter in list(self.waiting.items()):
            if waiter.holder == holder:
                self._unqueue(permit_id)

    def _unqueue(self, permit_id: str) -> None:
        waiter = self.waiting.pop(permit_id, None)
        if waiter is None:
            return
        key = (waiter.priority, waiter.tenant)
        queue = self.queues.get(key)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            pass
        if not queue:
            del self.queues[key]
            self._left(waiter.priority, waiter.tenant)

    def _left(self, priority: int, tenant: str) -> None:
        """`tenant` has no waiter left at `priority`."""
        rotation = self.rotations[priority]
        rotation.remove(tenant)
        if not rotation:
            del self.rotations[priority]

    def _grant(self, now: float) -> list[Grant]:
        grants: list[Grant] = []
        if now < self.paused_until:
            return grants
        while self.rotations and len(self.held) < self.limit:
            priority = min(self.rotations)
            rotation = self.rotations[priority]
            tenant = rotation[0]
            queue = self.queues[(priority, tenant)]
            waiter = queue.popleft()
            if queue:
                rotation.rotate(-1)
            else:
                del self.queues[(priority, tenant)]
                self._left(priority, tenant)
            del self.waiting[waiter.permit_id]
            self.held[waiter.permit_id] = (waiter.holder, now, waiter.tenant)
            grants.append((waiter.holder, waiter.permit_id))
        self.granted_total += len(grants)
        return grants

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        """(held, waiting) of `tenant`'s permits."""
        return (sum(1 for _, _, whose in self.held.values() if whose == tenant),
                sum(len(queue) for (_, whose), queue in self.queues.items() if whose == tenant))

    def stats(self, now: float) -> dict:
        return {"limit": self.limit, "held": len(self.held), "waiting": len(self.waiting),
                "tenants_waiting": len({tenant for _, tenant in self.queues}), "granted_total": self.granted_total,
                "paused_secs": round(max(0.0, self.paused_until - now), 3)}
