"""Flow queues: at most `limit` runs of a queue run at once, across all actors (as DBOS's
`Queue(concurrency=...)`), and with a rate, at most `starts` of its runs admitted in any
`per_secs` (as DBOS's `limiter`). The scheduler's side: one pool per queue whose permits are run
ids, so a place goes to the runs of the lowest `priority` number first (0 unless a start gave
one), FIFO within a tenant and round-robin between tenants among equals, and what its holders
(actors) report in their periodic sync is trusted as for provider permits: a run an actor no
longer lists gives its place back, one it lists that the pool does not know is adopted.

The run's own journal says whether it was admitted (`run.admitted`, actors/run_queues.py), so
neither side's restart runs a queue over its limit: a new scheduler grants nothing until its
holders have had the time of a sync to tell it what they hold, and a restarted actor lists the
admitted runs it recovered as held in its first sync (which drops its earlier incarnation's).
The rate's window is kept the same way: each actor reports its admissions of the last window
with their ages, so a new scheduler counts them; an actor that restarted too reads its
admissions of the window back from the journal first, ended runs' included.
A queue taken out of `kernel.flow_queues` while runs waited in it does not hold them for good:
they are admitted at once, with no limit left to keep.

A queue declared `per key` keeps its limit and rate for each key its runs name (`queue_key`:
a user, a customer, a document), as DBOS's partitioned queues and as Restate's virtual objects
serialize a key's calls: `"per_user=1 per key"` runs one run of each user at a time, any number
of users at once. `per tenant` does the same with each run's tenant for its key: a cap on what
one tenant of a shared server runs at once. A key is its tenant's (two tenants' "alice" are
two keys). Each key is a place of its own (`queue/tenant/key`) with its own pool, made when a run
first waits there and dropped once nothing holds, waits or counts in its window.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field

from actors.permits import Grant, PermitPool

SYNC_SECS = 2.0                  # an actor's report of its queued runs (actors/run_queues.py)
ADOPT_SECS = SYNC_SECS + 1.0     # a new scheduler's wait for those reports before its first grant
SWEEP_SECS = 5.0                 # how often the keys' places with nothing left are dropped
MAX_LIMIT = 100_000
MAX_WINDOW_SECS = 86_400.0
MAX_PRIORITY = 2 ** 31 - 1
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_RATE = re.compile(r"(\d+)/(\d+(?:\.\d+)?)s?\Z")
_PER = re.compile(r"\s+per\s+(key|tenant)\Z")
MAX_KEY = 200
_UNLIMITED = 10 ** 9             # a rate alone: the pool's places never run out


class QueueSpecError(ValueError):
    pass


def valid_queue_key(value: object) -> bool:
    """A run's key in a queue per key: 1 to MAX_KEY characters."""
    return type(value) is str and 0 < len(value) <= MAX_KEY


def valid_priority(value: object) -> bool:
    """A run's priority in its queue: a whole number, 0 (the default, first) to MAX_PRIORITY."""
    return type(value) is int and 0 <= value <= MAX_PRIORITY


@dataclass(frozen=True, slots=True)
class QueueSpec:
    limit: int | None            # runs at once (None: no limit, a rate alone)
    starts: int = 0              # with `per_secs`: at most this many admitted in any window of it
    per_secs: float = 0.0
    per: str | None = None       # "key", "tenant": the limit and rate hold for each of its runs' keys (tenants) apart

    def rate(self) -> dict | None:
        return {"starts": self.starts, "per_secs": self.per_secs} if self.starts else None


def parse_queues(spec: str) -> dict[str, QueueSpec]:
    """`"reports=2, mail=10@50/30s, hooks=*@5/1s, per_user=1 per key, fair=5 per tenant"` ->
    reports: 2 at once; mail: 10 at once and 50 admitted in any 30 s; hooks: 5 admitted in any
    second, however many run; per_user: one at once of each key's runs; fair: 5 of each tenant's."""
    queues: dict[str, QueueSpec] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not _NAME.match(name):
            raise QueueSpecError(f"{part!r}: each queue is name=limit or name=limit@starts/secs, perhaps then "
                                 "'per key', a name of letters, digits and _.:-")
        per = _PER.search(value)
        value = _PER.sub("", value)
        limit, at, rate = (x.strip() for x in value.partition("@"))
        if at:
            matched = _RATE.match(rate)
            if not matched:
                raise QueueSpecError(f"{part!r}: a queue's rate is starts/seconds, as 50/30s")
            starts, per_secs = int(matched[1]), float(matched[2])
            if not 1 <= starts <= MAX_LIMIT or not 0 < per_secs <= MAX_WINDOW_SECS:
                raise QueueSpecError(f"{part!r}: a rate's starts are 1 to {MAX_LIMIT:,}, "
                                     f"its seconds more than 0 and at most {MAX_WINDOW_SECS:,.0f}")
        else:
            starts, per_secs = 0, 0.0
        if limit == "*" and at:
            places = None
        elif not limit.isdigit() or not 1 <= int(limit) <= MAX_LIMIT:
            raise QueueSpecError(f"{part!r}: a queue's limit is a whole number, 1 to {MAX_LIMIT:,} "
                                 "(or * with a rate: no limit of runs at once)")
        else:
            places = int(limit)
        if name in queues:
            raise QueueSpecError(f"queue {name!r} is named twice")
        queues[name] = QueueSpec(places, starts, per_secs, per[1] if per else None)
    return queues


def place_of(specs: dict[str, QueueSpec], queue: str, key: str, tenant: str) -> str:
    """Where a run of `queue` with `key` waits: the queue itself, or for a queue per tenant its
    tenant's place, `queue/tenant`, or for a queue per key the tenant's key's, `queue/tenant/key`:
    a key is what its tenant names, as its session and run ids are (gateway/tenancy.py), so two
    tenants' "alice" are two places. Neither a queue's nor a tenant's name holds a '/'. The
    actors and the scheduler read the same config, so they name the same place."""
    spec = specs.get(queue)
    per = spec.per if spec is not None else None
    return f"{queue}/{tenant}/{key}" if per == "key" else f"{queue}/{tenant}" if per == "tenant" else queue


@dataclass
class QueuePool(PermitPool):
    """A `PermitPool` whose grants also keep to a rate: `starts` at most in any `per_secs`. A
    holder that goes silent keeps its places (unlike a provider permit's): its admitted runs are
    in their journals, and it comes back with them, or a new incarnation of it says what it holds;
    giving them away meanwhile ran a queue over its limit once a stall of an actor passed."""
    holder_timeout_secs: float = math.inf
    starts: int = 0
    per_secs: float = 0.0
    window: list = field(default_factory=list)          # heap of (admitted at, run id), the last per_secs
    in_window: set = field(default_factory=set)

    def note_start(self, run_id: str, at: float, now: float) -> None:
        """A run admitted at `at` (an actor's report to a new scheduler): it counts in the window."""
        if self.starts and run_id not in self.in_window and at > now - self.per_secs:
            heapq.heappush(self.window, (at, run_id))
            self.in_window.add(run_id)

    def due(self, now: float) -> bool:
        """Whether time alone may let a waiter in now: a new scheduler's wait ended, or the
        window's oldest admission left it while a place is free (else only a release can)."""
        return bool(self.paused_until and now >= self.paused_until) or bool(
            self.window and self.window[0][0] <= now - self.per_secs and len(self.held) < self.limit)

    def started_in_window(self, now: float) -> int:
        window = self.window
        while window and window[0][0] <= now - self.per_secs:
            self.in_window.discard(heapq.heappop(window)[1])
        return len(window)

    def _grant(self, now: float) -> list[Grant]:
        if not self.starts:
            return super()._grant(now)
        room = self.starts - self.started_in_window(now)
        if room <= 0:
            return []
        places, self.limit = self.limit, min(self.limit, len(self.held) + room)
        try:
            grants = super()._grant(now)
        finally:
            self.limit = places
        for _, run_id in grants:
            self.note_start(run_id, now, now)
        return grants


QueueGrant = tuple[str, str, str]   # (holder, queue, run id)


def _has(pool: QueuePool, holder: str) -> bool:
    return any(owner == holder for owner, *_ in pool.held.values()) or \
        any(w.holder == holder for w in pool.waiting.values())


class QueuePools:
    """The pools of every place (a queue, or a key's place of a queue per key), by its name; the
    `queue` of a request, grant, release or sync names a place."""

    def __init__(self, specs: dict[str, QueueSpec], now: float) -> None:
        self.specs = specs
        self.adopt_until = now + ADOPT_SECS
        self.pools = {name: self._new(spec) for name, spec in specs.items() if not spec.per}
        self.astir: set[str] = set()     # places that may have waiters: the only ones time can grant in
        self.next_sweep = now + SWEEP_SECS
        # A holder's sync looks at the places it names or has anything in, not at every key's
        # (a pass over 10,000 took 61 ms of the scheduler's loop), unless it is a new
        # incarnation of it: then every place, to drop what the old one held.
        self.holder_places: dict[str, set[str]] = {}
        self.incarnations: dict[str, int] = {}

    def _new(self, spec: QueueSpec) -> QueuePool:
        pool = QueuePool(limit=_UNLIMITED if spec.limit is None else spec.limit, starts=spec.starts,
                         per_secs=spec.per_secs)
        pool.paused_until = self.adopt_until
        return pool

    def _pool(self, place: str) -> QueuePool | None:
        """The place's pool, a key's made now; None for a queue no longer in the config (or no
        longer per key, or now per key: a place that is not what the config makes of it)."""
        pool = self.pools.get(place)
        if pool is None:
            queue, slash, _ = place.partition("/")
            spec = self.specs.get(queue)
            if spec is not None and spec.per and slash:
                pool = self.pools[place] = self._new(spec)
        return pool

    def _grants(self, queue: str, grants) -> list[QueueGrant]:
        return [(holder, queue, run_id) for holder, run_id in grants]

    def window_secs(self, place: str) -> float:
        """How long an actor reports a run of `place` as admitted (0: its queue has no rate)."""
        spec = self.specs.get(place.partition("/")[0])
        return spec.per_secs if spec is not None and spec.starts else 0.0

    def request(self, queue: str, run_id: str, holder: str, tenant: str, now: float,
                priority: int = 0) -> list[QueueGrant]:
        pool = self._pool(queue)
        if pool is None:   # a queue taken out of the config since the run was started: no limit left
            return [(holder, queue, run_id)]
        grants = self._grants(queue, pool.request(run_id, holder, tenant, now, priority))
        self.holder_places.setdefault(holder, set()).add(queue)
        if pool.waiting:
            self.astir.add(queue)
        return grants

    def release(self, queue: str, run_id: str, now: float) -> list[QueueGrant]:
        pool = self.pools.get(queue)
        if pool is None:
            return []
        grants = self._grants(queue, pool.release(run_id, now))
        if pool.waiting:   # (a place free and the rate's window full: time lets the next in)
            self.astir.add(queue)
        return grants

    def sync(self, holder: str, incarnation: int, queues: dict, now: float) -> list[QueueGrant]:
        """What one actor holds and waits for in each queue (`held`: [[run id, tenant]];
        `waiting`: [[run id, tenant] or [run id, tenant, priority]]), and the runs it admitted
        within a rate's window with their ages (`started`: [[run id, seconds ago]]); a queue it
        does not name, nothing."""
        grants: list[QueueGrant] = []
        for name, listed in queues.items():
            if isinstance(name, str) and isinstance(listed, dict) and self._pool(name) is None:   # (as in `request`)
                grants += [(holder, name, w[0]) for w in listed.get("waiting") or ()
                           if isinstance(w, list) and w and isinstance(w[0], str)]
        everywhere = self.incarnations.get(holder) != incarnation
        self.incarnations[holder] = incarnation
        names = self.pools.keys() if everywhere else self.holder_places.get(holder, set()) | queues.keys()
        visited = [(name, self.pools[name]) for name in list(names) if name in self.pools]
        for name, pool in visited:
            listed = queues.get(name) if isinstance(queues.get(name), dict) else {}
            for started in listed.get("started") or ():
                if (isinstance(started, list) and len(started) == 2 and isinstance(started[0], str)
                        and type(started[1]) in (int, float) and math.isfinite(started[1])):
                    pool.note_start(started[0], now - max(0.0, started[1]), now)
            tenants = {}   # (a run id alone: an actor of a version before tenants were listed)
            for h in listed.get("held") or ():
                if isinstance(h, str):
                    tenants[h] = ""
                elif isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h):
                    tenants[h[0]] = h[1]
            held = list(tenants)
            waiting = [w for w in listed.get("waiting") or ()
                       if isinstance(w, list) and len(w) in (2, 3) and all(isinstance(x, str) for x in w[:2])
                       and (len(w) == 2 or type(w[2]) is int)]
            grants += self._grants(name, pool.sync(holder, incarnation, held, [w[0] for w in waiting], now,
                                                   tenants=tenants))
            for run_id, tenant, *priority in waiting:   # asked before this scheduler began, or the request was lost
                if run_id not in pool.waiting and run_id not in pool.held:
                    grants += self._grants(name, pool.request(run_id, holder, tenant, now, *priority))
            if pool.waiting:
                self.astir.add(name)
        self.holder_places[holder] = {name for name, pool in visited if _has(pool, holder)}
        return grants

    def tick(self, now: float) -> list[QueueGrant]:
        """Grants that time makes: at the end of a new scheduler's wait, or as a rate's window
        moves on (a queue's holders never time out). So only places with waiters and a wait or a
        rate are looked at, ten times a second — a pass over every place took 12-20 ms at 10,000
        keys. Every SWEEP_SECS the keys' places with nothing left to keep are dropped (made again
        when needed)."""
        grants: list[QueueGrant] = []
        for name in list(self.astir):
            pool = self.pools.get(name)
            if pool is not None and pool.waiting and pool.due(now):
                grants += self._grants(name, pool.tick(now))
                if now >= pool.paused_until:
                    pool.paused_until = 0.0   # its wait is over
            if pool is None or not pool.waiting or not (pool.starts or pool.paused_until) or (
                    not pool.paused_until and len(pool.held) >= pool.limit):
                self.astir.discard(name)   # only a release (or a sync that frees a place) lets them in now
        if now >= self.next_sweep:
            self.next_sweep = now + SWEEP_SECS
            for name, pool in list(self.pools.items()):
                if "/" in name and not pool.held and not pool.waiting and not pool.started_in_window(now):
                    del self.pools[name]
        return grants

    def stats(self, now: float, tenant: str | None = None) -> dict[str, dict]:
        """Each queue's limit (None: a rate alone), runs admitted and not ended, runs waiting, and
        with a rate, the runs admitted in its last window; a queue per key's summed over its keys,
        with how many keys have places. With `tenant`, also that tenant's own runs admitted and
        waiting (`own_running`, `own_waiting`): a place of a queue per key or per tenant is one
        tenant's (`place_of`), a shared one's permits say whose they are."""
        own = {"own_running": 0, "own_waiting": 0} if tenant is not None else {}
        out: dict[str, dict] = {name: {"limit": spec.limit, "running": 0, "waiting": 0,
                                       **({"started_in_window": 0} if spec.starts else {}),
                                       **({"keys": 0} if spec.per else {}), **own}
                                for name, spec in self.specs.items()}
        for place, pool in self.pools.items():
            queue, slash, rest = place.partition("/")
            counts = out[queue]
            counts["running"] += len(pool.held)
            counts["waiting"] += len(pool.waiting)
            if own and slash:
                if rest.partition("/")[0] == tenant:
                    counts["own_running"] += len(pool.held)
                    counts["own_waiting"] += len(pool.waiting)
            elif own:
                running, waiting = pool.tenant_counts(tenant)
                counts["own_running"] += running
                counts["own_waiting"] += waiting
            if "started_in_window" in counts:
                counts["started_in_window"] += pool.started_in_window(now)
            if "keys" in counts and (pool.held or pool.waiting):
                counts["keys"] += 1
        return out
