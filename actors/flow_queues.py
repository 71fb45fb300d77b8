"""Flow queues: at most `limit` runs of a queue run at once, across all actors (as DBOS's
`Queue(concurrency=...)`). The scheduler's side: one `PermitPool` per queue whose permits are run
ids, so a place goes FIFO within a tenant and round-robin between tenants, and what its holders
(actors) report in their periodic sync is trusted as for provider permits: a run an actor no
longer lists gives its place back, one it lists that the pool does not know is adopted.

The run's own journal says whether it was admitted (`run.admitted`, actors/run_queues.py), so
neither side's restart runs a queue over its limit: a new scheduler grants nothing until its
holders have had the time of a sync to tell it what they hold, and a restarted actor lists the
admitted runs it recovered as held in its first sync (which drops its earlier incarnation's).
A queue taken out of `kernel.flow_queues` while runs waited in it does not hold them for good:
they are admitted at once, with no limit left to keep.
"""
from __future__ import annotations

import re

from actors.permits import PermitPool

SYNC_SECS = 2.0                  # an actor's report of its queued runs (actors/run_queues.py)
ADOPT_SECS = SYNC_SECS + 1.0     # a new scheduler's wait for those reports before its first grant
MAX_LIMIT = 100_000
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


class QueueSpecError(ValueError):
    pass


def parse_queues(spec: str) -> dict[str, int]:
    """`"reports=2, mail=10"` -> {"reports": 2, "mail": 10}."""
    queues: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, limit = (x.strip() for x in part.partition("="))
        if not sep or not _NAME.match(name):
            raise QueueSpecError(f"{part!r}: each queue is name=limit, a name of letters, digits and _.:-")
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIMIT:
            raise QueueSpecError(f"{part!r}: a queue's limit is a whole number, 1 to {MAX_LIMIT:,}")
        if name in queues:
            raise QueueSpecError(f"queue {name!r} is named twice")
        queues[name] = int(limit)
    return queues


QueueGrant = tuple[str, str, str]   # (holder, queue, run id)


class QueuePools:
    def __init__(self, limits: dict[str, int], now: float) -> None:
        self.pools = {name: PermitPool(limit=limit) for name, limit in limits.items()}
        for pool in self.pools.values():
            pool.paused_until = now + ADOPT_SECS

    def _grants(self, queue: str, grants) -> list[QueueGrant]:
        return [(holder, queue, run_id) for holder, run_id in grants]

    def request(self, queue: str, run_id: str, holder: str, tenant: str, now: float) -> list[QueueGrant]:
        pool = self.pools.get(queue)
        if pool is None:   # a queue taken out of the config since the run was started: no limit left
            return [(holder, queue, run_id)]
        return self._grants(queue, pool.request(run_id, holder, tenant, now))

    def release(self, queue: str, run_id: str, now: float) -> list[QueueGrant]:
        pool = self.pools.get(queue)
        return [] if pool is None else self._grants(queue, pool.release(run_id, now))

    def sync(self, holder: str, incarnation: int, queues: dict, now: float) -> list[QueueGrant]:
        """What one actor holds and waits for in each queue; a queue it does not name, nothing."""
        grants: list[QueueGrant] = []
        for name, listed in queues.items():
            if name not in self.pools and isinstance(listed, dict):   # (as in `request`)
                grants += [(holder, name, w[0]) for w in listed.get("waiting") or ()
                           if isinstance(w, list) and w and isinstance(w[0], str)]
        for name, pool in self.pools.items():
            listed = queues.get(name) if isinstance(queues.get(name), dict) else {}
            held = [str(r) for r in listed.get("held") or () if isinstance(r, str)]
            waiting = [w for w in listed.get("waiting") or ()
                       if isinstance(w, list) and len(w) == 2 and all(isinstance(x, str) for x in w)]
            grants += self._grants(name, pool.sync(holder, incarnation, held, [w[0] for w in waiting], now))
            for run_id, tenant in waiting:   # asked before this scheduler began, or the request was lost
                if run_id not in pool.waiting and run_id not in pool.held:
                    grants += self._grants(name, pool.request(run_id, holder, tenant, now))
        return grants

    def tick(self, now: float) -> list[QueueGrant]:
        grants: list[QueueGrant] = []
        for name, pool in self.pools.items():
            grants += self._grants(name, pool.tick(now))
        return grants

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: {"limit": pool.limit, "running": len(pool.held), "waiting": len(pool.waiting)}
                for name, pool in self.pools.items()}
