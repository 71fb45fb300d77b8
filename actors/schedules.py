"""Schedules: flow runs started on a cron expression (actors/cron.py), as DBOS's scheduled
workflows or Temporal's schedules.

A schedule is kept as a run of its own, of the reserved flow `@schedule`, owned by an actor like
any run: its `run.started` record holds its definition, an `attr.set` of `definition` each change
to it, its `run.ended` (cancelled) its deletion. So it is journaled, recovered after a restart
and removed by retention once deleted, with no store of its own. Its id is
`<tenant~>@sched:<name>/<generation>`: what precedes the '/' routes it, so every generation of a
name is one actor's (the one that serializes its changes); the '/' keeps it out of the run
listing, and no client's run id can name it. Nothing dispatches it to a worker.

Each time its expression matches, it starts a run of its flow and input named
`<name>-<the time in UTC, 20261206T090000Z>`, whose summary names the schedule. A start sent
again (after a crash, or by the watchdog and the timer both) names the same run, so a time
starts one run, however often it is fired. A time missed while the owning actor was down or
stalled is started when it is back if it is at most `catchup_secs` old (each such time, the latest
MAX_CATCHUP_RUNS of them; older ones are skipped), also when a change or the deletion comes first.
A schedule's runs may overlap: each time starts its own, unless the schedule names a flow queue
(`queue`): then they wait for its places like any run of it (a queue of one: one at a time, in
order).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from actors.cron import Cron, CronError
from actors.flow_state import Run
from agentos import metrics
from broker.client import BusError
from broker.protocol import Kind, Message
from broker.sharding import SCHEDULER, actor_name
from storage.log_client import LogWriteError

SCHEDULE_FLOW = "@schedule"
PREFIX = "@sched:"
TICK_SEQ = -2                       # its timer's (a delayed start's is -1)
DEFAULT_CATCHUP_SECS = 60.0
MAX_CATCHUP_SECS = 7 * 86400.0
MAX_CATCHUP_RUNS = 100              # the times one catch-up starts at most (the latest)
START_RETRY_SECS = 60.0             # past its time and its catch-up, a start that found no actor is given up
DEFINED = ("flow", "cron", "timezone", "input", "catchup_secs", "queue")


def schedule_key(internal_name: str) -> str:
    """The routing part of a schedule's run ids (`acme~nightly` -> `acme~@sched:nightly`)."""
    tenant, sep, name = internal_name.rpartition("~")
    return f"{tenant}{sep}{PREFIX}{name}"


def run_name(key: str, at: float) -> str:
    """The run a schedule starts for time `at`: in the schedule's tenant, `<name>-<UTC time>`."""
    tenant, _, name = key.partition(PREFIX)
    return f"{tenant}{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(at))}"


def definition(run: Run) -> dict[str, Any]:
    return run.attrs.get("definition") or run.input


class Schedules:
    """A mixin of `actors.flow_runs.Flows`: the schedules its actor owns, their timers, and the
    runs they start."""

    def schedule_handlers(self) -> dict:
        timed = self.in_time
        return {Kind.SCHEDULE_PUT: timed(self.on_schedule_put), Kind.SCHEDULE_GET: self.on_schedule_get,
                Kind.SCHEDULE_DELETE: timed(self.on_schedule_delete), Kind.SCHEDULE_LIST: self.on_schedule_list}

    def _schedule(self, key: str, tenant: str) -> Run | None:
        """The schedule's current generation (not deleted), if any."""
        head = key + "/"
        return next((run for run_id, run in self.runs.items() if run_id.startswith(head)
                     and run.flow == SCHEDULE_FLOW and not run.ended and run.tenant == tenant), None)

    def _view(self, run: Run) -> dict[str, Any]:
        d = definition(run)
        view = {field: d.get(field) for field in ("name", *DEFINED)}
        view.update(created_at=run.created_at, updated_at=d.get("updated_at"),
                    next_at=self.schedule_next.get(run.run_id))
        return view

    async def on_schedule_put(self, msg: Message) -> None:
        await self.ready.wait()
        b = msg.body
        key, catchup = b["key"], b.get("catchup_secs", DEFAULT_CATCHUP_SECS)
        try:
            Cron(b["cron"], b.get("timezone") or "UTC")
            if not (key.endswith(PREFIX + b["name"]) and "/" not in key):
                raise CronError("a schedule's key is <tenant~>@sched:<its name>")
            if not (math.isfinite(catchup) and 0 <= catchup <= MAX_CATCHUP_SECS):
                raise CronError(f"catchup_secs is 0 to {MAX_CATCHUP_SECS:.0f}")
        except CronError as exc:
            self.bus.reply(msg, Kind.SCHEDULE, {"found": False, "code": "invalid_schedule", "error": str(exc)})
            return
        d = {"name": b["name"], "flow": b["flow"], "cron": b["cron"], "timezone": b.get("timezone") or "UTC",
             "input": b.get("input"), "catchup_secs": float(catchup), "queue": b.get("queue") or None,
             "updated_at": time.time()}
        async with self.schedule_locks.setdefault(key, asyncio.Lock()):
            if self.given_up(msg, "had its turn"):   # (a change waits for the one before it)
                return
            run = self._schedule(key, b["tenant"])
            created = run is None
            if run is not None:
                self._catch_up_first(run)
            try:
                if run is None:
                    run = Run(f"{key}/{time.time_ns():x}", SCHEDULE_FLOW, b["tenant"])
                    self.runs[run.run_id] = run
                    try:
                        await self.record(run, "run.started", flow=SCHEDULE_FLOW, input=d)
                    except LogWriteError:
                        del self.runs[run.run_id]
                        raise
                elif any(definition(run).get(f) != d[f] for f in DEFINED):
                    before = run.attrs.get("definition")
                    try:
                        await self.record(run, "attr.set", key="definition", value=d, seq=-1)
                    except LogWriteError:   # memory went ahead of the journal: back to what it holds
                        run.attrs["definition"] = before
                        raise
                else:
                    self.bus.reply(msg, Kind.SCHEDULE, {"found": True, "created": False, "schedule": self._view(run)})
                    return
            except LogWriteError as exc:
                self.bus.reply(msg, Kind.SCHEDULE, {"found": False, "code": exc.code, "error": f"not saved: {exc}"})
                return
            self.arm_schedule(run, time.time(), catch_up=False)
        self.bus.reply(msg, Kind.SCHEDULE, {"found": True, "created": created, "schedule": self._view(run)})

    async def on_schedule_get(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._schedule(msg.body["key"], msg.body["tenant"])
        self.bus.reply(msg, Kind.SCHEDULE, {"found": False} if run is None else
                       {"found": True, "schedule": self._view(run)})

    async def on_schedule_delete(self, msg: Message) -> None:
        await self.ready.wait()
        key = msg.body["key"]
        async with self.schedule_locks.setdefault(key, asyncio.Lock()):
            if self.given_up(msg, "had its turn"):
                return
            run = self._schedule(key, msg.body["tenant"])
            if run is None:
                self.bus.reply(msg, Kind.SCHEDULE, {"found": False})
                return
            self._catch_up_first(run)
            before = run.status, run.error, run.ended_at
            try:
                await self.end(run, "cancelled", error="schedule deleted")
            except LogWriteError as exc:
                run.status, run.error, run.ended_at = before   # as its journal has it: still on
                self.bus.reply(msg, Kind.SCHEDULE, {"found": False, "code": exc.code, "error": f"not deleted: {exc}"})
                return
            self.schedule_next.pop(run.run_id, None)
        self.bus.reply(msg, Kind.SCHEDULE, {"found": True, "schedule": self._view(run)})

    async def on_schedule_list(self, msg: Message) -> None:
        await self.ready.wait()
        tenant = msg.body["tenant"]
        views = [self._view(run) for run in list(self.runs.values())
                 if run.flow == SCHEDULE_FLOW and not run.ended and run.tenant == tenant]
        self.bus.reply(msg, Kind.SCHEDULES, {"schedules": views})

    # -- its times -----------------------------------------------------------------------------

    def _cron(self, run: Run) -> Cron:
        d = definition(run)
        known = self.schedule_crons.get(run.run_id)
        if known is None or known[0] != d.get("updated_at"):
            known = self.schedule_crons[run.run_id] = (d.get("updated_at"), Cron(d["cron"], d.get("timezone") or "UTC"))
        return known[1]

    def _catch_up_first(self, run: Run) -> None:
        """Before a change or the deletion: the times due before it start, under the definition
        they were due under. Back from a restart or a stall, the watchdog's next turn would start
        them, and a change can come first (as the actor came back, a deletion had made them lost)."""
        self.tick_schedule(run, time.time(), resync=False)

    def tick_schedule(self, run: Run, wall: float, resync: bool) -> None:
        """The watchdog's turn, and its timer's: start what is due, arm the next time."""
        due = self.schedule_next.get(run.run_id)
        if due is None or wall >= due:   # (none: just loaded, after a restart: what it may have missed)
            self.arm_schedule(run, wall, catch_up=True)
        elif resync:
            self._set_tick(run, due)

    def arm_schedule(self, run: Run, now: float, catch_up: bool) -> None:
        d = definition(run)
        try:
            cron = self._cron(run)
        except CronError as exc:   # (checked when it was saved: a time zone this machine lost since)
            self.log.warning("schedule %s cannot run: %s", run.run_id, exc)
            self.schedule_next.pop(run.run_id, None)
            return
        if catch_up:   # from its change, within its catch-up, and past what this actor started already
            low = max(float(d.get("updated_at") or 0.0), now - float(d["catchup_secs"]),
                      self.schedule_started.get(run.run_id, 0.0) + 0.5)
            for at in cron.times_in(low, now, MAX_CATCHUP_RUNS):
                self.bus.spawn(self._start_scheduled(run, d, at))
                self.schedule_started[run.run_id] = at
        following = cron.next_after(now)
        if following is None:
            self.schedule_next.pop(run.run_id, None)
            return
        self.schedule_next[run.run_id] = following
        self._set_tick(run, following)

    def _set_tick(self, run: Run, due: float) -> None:
        self.bus.send(SCHEDULER, Kind.TIMER_SET, {"timer_id": f"{run.run_id}:{TICK_SEQ}", "run_id": run.run_id,
                                                  "due": due}, session=run.run_id)

    async def _start_scheduled(self, run: Run, d: dict[str, Any], at: float) -> None:
        """Start the run of time `at` (the same run however often asked), retried while its
        actor cannot be reached, until the time is past its catch-up."""
        key = run.run_id.split("/", 1)[0]
        target = run_name(key, at)
        if target in self.schedule_starting:
            return
        self.schedule_starting.add(target)
        body = {"flow": d["flow"], "run_id": target, "tenant": run.tenant, "input": d.get("input"),
                "schedule": d["name"], "scheduled_at": at}
        if d.get("queue"):   # a queue of one place: the schedule's runs never overlap, they wait their turn
            body["queue"] = d["queue"]
            spec = self.queue_specs.get(d["queue"])
            if spec is not None and spec.per == "key":   # each schedule's runs have a place of their own there
                body["queue_key"] = d["name"]
        give_up = at + max(float(d["catchup_secs"]), START_RETRY_SECS)
        tries = 0
        try:
            while True:
                tries += 1
                try:
                    reply = await self.bus.request(actor_name(target, self.shards), Kind.FLOW_START,
                                                   {**body, "deadline": time.time() + 30.0}, timeout=30.0,
                                                   attempt_secs=5.0, session=target)
                    code, error = reply.body.get("code"), reply.body.get("error")
                except BusError as exc:
                    code, error = "unavailable", str(exc)
                if not code:
                    metrics.inc(metrics.schedule_starts.labels("started" if reply.body.get("created") else "repeated"))
                    if reply.body.get("created") and (tries > 1 or time.time() - at > 5.0):   # how late a run can begin
                        self.log.info("schedule %s started %s at the %d. try, %.1f s past its time",
                                      d["name"], target, tries, time.time() - at)
                    return
                if code == "conflict" or time.time() > give_up:
                    metrics.inc(metrics.schedule_starts.labels("refused" if code == "conflict" else "given_up"))
                    self.log.warning("schedule %s did not start %s: %s", d["name"], target, error or code)
                    return
                await asyncio.sleep(1.0)
        finally:
            self.schedule_starting.discard(target)
