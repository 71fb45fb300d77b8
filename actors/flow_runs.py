"""Flow runs owned by an actor: their journals, their executions, and what wakes them.

A run is owned by the actor its id hashes to. Its code runs on a worker, one execution at a
time: each dispatch gets a new execution number (unique across actor restarts), every request of
an execution carries it, and requests of a superseded execution are answered `abort`. The
worker asks this actor before every durable operation (`step.start`) and reports its outcome
(`step.result`); the actor journals both (SYNC: before answering; ASYNC: after) and replays
recorded outcomes so a committed step never runs twice.

A run that sleeps, waits on an empty channel or waits for a child holds no worker: its execution
ends (`suspend`) and the run is dispatched again when its timer fires, a message arrives, or the
child ends. Workers report the executions and tasks they run every second (`worker.alive`); one
silent for `EXEC_GRACE_SECS` is dispatched again. Attribute updates run one at a time per run
(its lock): a handler on a worker computes the new value from the current one, and the value is
committed before the caller hears of it.

This module holds the runs, their journal, dispatching and the watchdog; the answers to workers
are in actors/worker_requests.py and those to callers in actors/run_requests.py (both mixins of
`Flows`).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

from actors import flow_metrics
from actors.flow_queues import SYNC_SECS
from actors.flow_state import Op, Run, apply, replay
from actors.run_links import RunLinks
from actors.run_messages import INTERNAL_FLOWS, RunMessages
from actors.run_queues import RunQueues
from actors.run_tasks import RunTasks
from actors.run_reloads import Reload, RunReloads, Stale
from actors.run_requests import RunRequests
from actors.schedules import SCHEDULE_FLOW, Schedules
from actors.worker_requests import WorkerRequests
from agentos import metrics
from agentos.log_repeats import Repeats
from broker.client import Bus
from broker.protocol import MAX_RUN_BYTES, Kind, Message
from broker.sharding import SCHEDULER, shard_of
from storage.log_client import LogClient
from storage.records import RecordKind

EXEC_GRACE_SECS = 4.0
MAX_LOST_EXECUTIONS = 5         # in a row, with no record between, their workers dead: the run fails (on_task_lost)
MAX_LEFT_EXECUTIONS = 20        # the same, their workers stopped cleanly: no deploys come that fast, a kill(self) does
TIMER_GRACE_SECS = 2.0
RESYNC_SECS = 10.0
UNCOUNTED = INTERNAL_FLOWS   # in actors/flow_metrics.py: turns have their own
ENDED_RETENTION_SECS = 60.0
SUPERSEDED = {"ok": False, "code": "superseded"}   # what a worker's execution hears when it is no longer the run's


def run_id_for_key(flow: str, tenant: str, key: str) -> str:
    """A run id derived from an idempotency key: a retried start lands on the same run."""
    return f"{flow}-{hashlib.sha1(f'{tenant}|{flow}|{key}'.encode()).hexdigest()[:20]}"


class Flows(WorkerRequests, RunRequests, RunMessages, RunReloads, RunLinks, Schedules, RunQueues, RunTasks):
    def __init__(self, bus: Bus, log: LogClient, query, index: int, shards: int, logger: logging.Logger,
                 retention_secs: float = ENDED_RETENTION_SECS) -> None:
        self.bus = bus
        self.journal_log = log
        self.query = query                     # async (name, session, **params) -> store reply body
        self.index = index
        self.shards = shards
        self.log = logger
        self.runs: dict[str, Run] = {}
        self.starting: dict[str, asyncio.Future] = {}
        self.ready = asyncio.Event()
        self.exec_counter = 0
        self.task_counter = 0
        self.tasks: dict[str, list] = {}       # task id -> [future, submit body, last sign of life, worker]
        self.unknown_tasks: dict[str, float] = {}   # task id a worker runs and this actor does not know -> first told
        self.run_workers: dict[str, str] = {}  # run id -> the worker that reported running it
        self.adopted: set[str] = set()         # runs reloaded after a restart, execution not yet seen
        self.on_open_turn = None               # the actor finishes interrupted turns (flow "turn")
        self.keep_ended_secs = min(ENDED_RETENTION_SECS, retention_secs)
        self.reloading: dict[str, Reload] = {}   # run id -> its way back from its journal
        self.reloads_said = Repeats()
        self.store_away_said = Repeats()     # requests writer/store's silence kept from being served
        self.given_up_said = Repeats()       # writes dropped: they came after their caller gave up
        self.reloaded: dict[str, tuple[float, float]] = {}   # run id -> (last reload, its wait)
        self.schedule_next: dict[str, float] = {}   # schedule's run id -> its next time (actors/schedules.py)
        self.schedule_crons: dict[str, tuple] = {}  # -> (its definition's updated_at, its parsed expression)
        self.schedule_started: dict[str, float] = {}   # -> the latest of its times this actor started
        self.schedule_locks: dict[str, asyncio.Lock] = {}
        self.schedule_starting: set[str] = set()   # runs being started for a schedule's time
        self.admitting: set[str] = set()   # queued runs whose admission is being journaled (actors/run_queues.py)
        self.queues_synced = False
        self.queue_starts: dict[str, tuple[str, float, float]] = {}   # run id -> (place, admitted at, rate window)
        self.queue_specs: dict = {}   # kernel.flow_queues: which queues are per key

    def handlers(self) -> dict:
        away = self.store_away    # what callers ask may need a run's journal read back from writer/store
        timed = self.in_time      # writes whose caller gave up are not acted on
        return {Kind.FLOW_START: timed(away(self.on_start, Kind.FLOW_RUN)),
                Kind.FLOW_GET: away(self.on_get, Kind.FLOW_RUN),
                Kind.FLOW_STEPS: away(self.on_steps, Kind.FLOW_OPS),
                Kind.FLOW_CANCEL: timed(away(self.on_cancel, Kind.FLOW_RUN)),
                Kind.FLOW_COMPLETE: self.refusable(self.on_complete, Kind.FLOW_ACK, SUPERSEDED),
                Kind.FLOW_CHILD_DONE: self.refusable(self.on_child_done),   # no answer: the child asks again
                Kind.STEP_START: self.refusable(self.on_step_start, Kind.STEP_GO, {"action": "abort"}),
                Kind.STEP_RESULT: self.refusable(self.on_step_result, Kind.FLOW_ACK, SUPERSEDED),
                Kind.STEP_HEARTBEAT: self.on_heartbeat, Kind.TIMER_FIRE: self.on_timer_fire,
                Kind.CHANNEL_PUBLISH: timed(away(self.on_publish, Kind.FLOW_ACK)),
                Kind.CHANNEL_BROADCAST: timed(self.on_broadcast), Kind.CHANNEL_WAITING: self.on_waiting,
                Kind.ATTR_GET: away(self.on_attr_get, Kind.ATTR_VALUES),
                Kind.ATTR_UPDATE: timed(away(self.on_attr_update, Kind.ATTR_VALUES)),
                Kind.TASK_RESULT: self.on_task_result,
                Kind.WORKER_ALIVE: self.on_alive, Kind.TASK_LOST: self.on_task_lost,
                Kind.QUEUE_GRANT: self.on_queue_grant, **self.schedule_handlers()}

    # -- the journal ---------------------------------------------------------------------------

    def record(self, run: Run, kind: str, sync: bool = True, **fields: Any) -> asyncio.Future | None:
        """Apply a record to the run now and append it; SYNC returns the future of its ack."""
        if run.stale:   # what its memory does now is superseded: it comes back from its journal
            if not sync:
                return None
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(Stale())
            return fut
        body = {"run": run.run_id, "tenant": run.tenant, "type": kind, "at": time.time(), "exec": run.exec, **fields}
        apply(run, body)
        if run.flow not in UNCOUNTED:
            flow_metrics.count(run.flow, kind, fields)
        run.lost = run.left = 0   # it moves on: the workers that died or stopped before were not its doing
        if run.journal_bytes > MAX_RUN_BYTES and not run.over_limit and not run.ended and run.flow != "turn":
            run.over_limit = True   # this record is kept; the run's end follows it
            self.bus.spawn(self.or_reload(run, self.end(run, "failed", error=(
                f"the run's journal passed {MAX_RUN_BYTES:,} bytes of values, the most a run records "
                "(its steps' results, attributes, messages): start a new run to go on"))))
        # Routed like the run's actor: a turn's run (`session/turn`) goes to its session's writer.
        session = run.run_id.split("/", 1)[0]
        if sync:
            fut = asyncio.ensure_future(self.journal_log.append(RecordKind.FLOW, body, session, sync=True))
        else:   # nobody could be told of its failure, so a full disk must not drop it: sent until written
            fut = asyncio.ensure_future(self.journal_log.append_kept(RecordKind.FLOW, body, session))
        run.pending.add(fut)
        fut.add_done_callback(run.pending.discard)
        if kind == "run.ended" and run.queue:
            self.queue_ended(run, fut)
        return fut if sync else None

    # -- finding runs --------------------------------------------------------------------------

    async def load(self) -> None:
        """After a start: every open run of this shard, rebuilt from its journal. Flow requests
        wait until this is done (a worker of a run from before the restart may be asking)."""
        while True:
            try:
                await self.recover_queue_starts()
                rows = (await self.query("open_runs", "", sync=True))["rows"]
                mine = [r["run_id"] for r in rows if shard_of(r["run_id"].split("/", 1)[0], self.shards) == self.index]
                for run_id in mine:
                    if run_id in self.runs:   # begun by this incarnation while the query ran
                        continue
                    run = await self._load_run(run_id)
                    if run is None or run.ended:
                        continue
                    if run.flow == "turn":
                        if self.on_open_turn is not None:
                            self.on_open_turn(run)
                        continue
                    if run.flow == SCHEDULE_FLOW:   # the watchdog arms it, and starts what it missed
                        continue
                    self.adopted.add(run_id)
                    self.resume(run)
                    if run.parent:
                        self.bus.spawn(self.follow_parent(run))
                break
            except Exception as exc:  # the store may still be starting: keep trying
                self.log.warning("cannot load open flow runs yet (%s); retrying", exc)
                await asyncio.sleep(1.0)
        if mine:
            self.log.info("recovered %d open flow runs", len(mine))
        self.ready.set()

    async def _load_run(self, run_id: str, write: bool = False) -> Run | None:
        """The run from its journal. One on its way back already (actors/run_reloads.py) is
        waited for, not loaded twice; for a `write`, not for long (LogWriteError past that)."""
        if run_id in self.reloading:
            return await self.back_from_journal(run_id, write)
        return await self._load_journal(run_id)

    async def _load_journal(self, run_id: str) -> Run | None:
        rows = (await self.query("flow_records", run_id, sync=True))["rows"]
        if not rows:
            return None
        run = replay(run_id, rows)
        run.last_alive = time.monotonic()
        self.runs[run_id] = run
        return run

    async def find(self, run_id: str, tenant: str, read: bool = False) -> Run | None:
        """The run, loaded if need be. A read of a run that is coming back from its journal (a
        refused record, actors/run_reloads.py; that can last as long as the disk is full) is
        answered from the journal at once, by a copy that records nothing."""
        await self.ready.wait()
        run = self.runs.get(run_id)
        if run is None and read and run_id in self.reloading:
            rows = (await self.query("flow_records", run_id, sync=True))["rows"]
            run = replay(run_id, rows) if rows else None
            if run is not None:
                run.stale = True
                if not run.ended and self.blocked_on(run) is not None:
                    run.status = "suspended"
        elif run is None:
            run = await self._load_run(run_id, write=not read)
        if run is None or run.tenant != tenant:
            return None
        return run

    # -- executions ----------------------------------------------------------------------------

    def blocked_on(self, run: Run) -> Op | None:
        """The unfinished sleep, wait or child op the run is parked on, if any; for a delayed
        start whose time has not come, an op of seq -1 due then (its timer's)."""
        if run.waits_to_start(time.time()):
            start = Op(-1, "start", "start")
            start.due = run.start_at
            return start
        if run.waits_in_queue():   # (seq -3: no record, no timer; its place is asked for)
            return Op(-3, "queue", run.queue)
        op = run.first_unfinished()
        return op if op is not None and op.op in ("sleep", "wait", "child") else None

    def dispatch(self, run: Run) -> None:
        """A new execution of the run on some worker (a schedule's has none: its actor runs it)."""
        if run.ended or run.flow == SCHEDULE_FLOW:
            return
        if run.waits_in_queue():
            self.enqueue(run)
            return
        self.exec_counter += 1
        run.exec = (self.bus.incarnation << 24) | self.exec_counter
        run.last_alive = time.monotonic()
        run.status = "running"
        run.executing = True
        self.adopted.discard(run.run_id)
        self.bus.send(SCHEDULER, Kind.TASK_SUBMIT, {
            "task_id": f"{run.run_id}#{run.exec}", "kind": "flow", "name": run.flow, "tenant": run.tenant,
            "run_id": run.run_id, "exec": run.exec,
            "payload": {"input": run.input, "journal": run.journal(), "attrs": run.attrs}}, session=run.run_id)

    def resume(self, run: Run) -> None:
        """Re-arm what a recovered run waits for; an execution may still be alive (adopted)."""
        op = self.blocked_on(run)
        if op is None:
            return  # running: the watchdog dispatches it again unless its worker reports it alive
        if op.op in ("sleep", "start") or (op.op == "wait" and op.due):
            self.set_timer(run, op)
        if op.op == "wait":
            run.waiting = op.seq
            self.bus.spawn(self._take_and_run(run, op))
        for child in self.open_children(run):   # its end may have come while this actor was down, or it never began
            if child.child:
                self.bus.spawn(self.follow_child(run, child))
        if op.op == "queue":
            self.enqueue(run)

    async def _take_and_run(self, run: Run, op: Op) -> None:
        """A message may wait already (published before the wait, and the actor died before taking
        it): take it and run on now, not at the next publish."""
        if await self._take_message(run, op):
            self.dispatch(run)

    def set_timer(self, run: Run, op: Op) -> None:
        self.bus.send(SCHEDULER, Kind.TIMER_SET, {"timer_id": f"{run.run_id}:{op.seq}", "run_id": run.run_id,
                                                  "due": op.due}, session=run.run_id)

    def _current(self, msg: Message) -> Run | None:
        """The run a worker request is about, if that execution is still the current one."""
        run = self.runs.get(msg.body["run_id"])
        if run is None or run.ended:
            return None
        exec_ = msg.body["exec"]
        if exec_ != run.exec:
            if run.run_id in self.adopted and exec_ > run.exec:
                run.exec = exec_  # a live execution of before our restart: adopt it
            else:
                return None
        self.adopted.discard(run.run_id)
        run.last_alive = time.monotonic()
        return run

    # -- the watchdog ---------------------------------------------------------------------------

    async def watchdog(self) -> None:
        last_resync = last_tick = last_queue_sync = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now, wall = time.monotonic(), time.time()
            if now - last_tick > EXEC_GRACE_SECS / 2:
                self._stalled(now)
            last_tick = now
            resync = now - last_resync > RESYNC_SECS
            if resync:
                last_resync = now
            if now - last_queue_sync >= SYNC_SECS and self.ready.is_set():
                last_queue_sync = now
                self.sync_queues()
            metrics.flow_runs_open.set(sum(1 for run in self.runs.values() if not run.ended
                                           and run.flow not in UNCOUNTED))
            for run in list(self.runs.values()):
                if run.flow == "turn":  # turns run in their actor, not on workers
                    if run.ended and now - run.last_alive > self.keep_ended_secs:
                        self._forget(run.run_id)
                    continue
                if run.flow == SCHEDULE_FLOW and not run.ended:
                    self.tick_schedule(run, wall, resync)
                    continue
                if run.ended:
                    if now - run.last_alive > self.keep_ended_secs and not run.updating:
                        self._forget(run.run_id)
                    continue
                if run.timeout_at and wall > run.timeout_at and not run.timing_out and not run.stale:
                    self.bus.spawn(self.time_out(run))
                    continue
                self.check_links(run, now)
                op = self.blocked_on(run)
                if op is None:
                    if now - run.last_alive > EXEC_GRACE_SECS:
                        self.dispatch(run)  # its worker died, or its task never started
                elif op.due and wall > op.due + TIMER_GRACE_SECS:
                    self.bus.spawn(self._timer_fired(run, op.seq))  # the scheduler's notice never came
                elif op.due and resync:
                    self.set_timer(run, op)
            for task_id, entry in list(self.tasks.items()):
                if now - entry[2] > EXEC_GRACE_SECS:
                    entry[2] = now
                    self.bus.send(SCHEDULER, Kind.TASK_SUBMIT, entry[1], session=entry[1].get("run_id", ""))

    def _stalled(self, now: float) -> None:
        """This actor did not run for a while (stopped, starved): its workers' reports meanwhile
        waited or bounced (the broker bounces what is sent to a peer silent past its timeout), so
        their silence says nothing. Each execution and task gets its grace again. Without this a
        stalled actor took every execution it had for dead, and dispatched the run anew before
        the results sent again reached it: an ASYNC step, done, ran again."""
        for run in self.runs.values():
            if not run.ended:
                run.last_alive = now
        for entry in self.tasks.values():
            entry[2] = now

    def on_task_lost(self, msg: Message) -> None:
        """The worker running this execution died with it. Again and again with no step between,
        and it is the run's own code that kills them: it fails rather than take down every worker.
        A worker that said goodbye as it stopped (a deploy, a scale-down) says little of the run's
        code: its execution goes to the next worker and counts toward a far higher bound."""
        run = self.runs.get(msg.body["run_id"])
        if run is None or run.ended or run.exec != msg.body["exec"]:
            return
        if msg.body.get("left"):
            run.left += 1
        else:
            run.lost += 1
        if run.lost < MAX_LOST_EXECUTIONS and run.left < MAX_LEFT_EXECUTIONS:
            if self.blocked_on(run) is None:
                self.dispatch(run)   # now, not after the watchdog's grace
            return
        if run.lost >= MAX_LOST_EXECUTIONS:
            error = (f"its last {run.lost} executions died with their workers ({msg.body['worker']} the last) "
                     "before taking a step: its code may crash the worker process")
        else:
            error = (f"its workers stopped under its last {run.left} executions ({msg.body['worker']} the last) "
                     "before it took a step: its code may stop the worker process")
        self.bus.spawn(self.or_reload(run, self.end(run, "failed", error=error)))

    def _forget(self, run_id: str) -> None:
        """An ended run leaves memory (its journal stays in the log and DuckDB), with what refers to it."""
        del self.runs[run_id]
        self.run_workers.pop(run_id, None)   # else one entry per run ever executed here
        self.schedule_crons.pop(run_id, None)
        self.schedule_started.pop(run_id, None)
        self.adopted.discard(run_id)

    def stats(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for run in self.runs.values():
            counts[run.status] = counts.get(run.status, 0) + 1
        return {"runs": counts, "tasks_waiting": len(self.tasks), "run_workers": len(self.run_workers)}

