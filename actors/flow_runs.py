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
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

from actors.flow_state import WAITABLE, Op, Run, apply, replay
from broker.client import Bus, BusError
from broker.protocol import Kind, Message
from broker.sharding import actor_name, shard_of
from storage.log_client import LogClient
from storage.records import RecordKind

SCHEDULER = "scheduler"
EXEC_GRACE_SECS = 4.0
TIMER_GRACE_SECS = 2.0
RESYNC_SECS = 10.0
ENDED_RETENTION_SECS = 60.0


class TaskFailed(RuntimeError):
    pass


def run_id_for_key(flow: str, tenant: str, key: str) -> str:
    """A run id derived from an idempotency key: a retried start lands on the same run."""
    return f"{flow}-{hashlib.sha1(f'{tenant}|{flow}|{key}'.encode()).hexdigest()[:20]}"


class Flows:
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
        self.run_workers: dict[str, str] = {}  # run id -> the worker that reported running it
        self.adopted: set[str] = set()         # runs reloaded after a restart, execution not yet seen
        self.on_open_turn = None               # the actor finishes interrupted turns (flow "turn")
        self.keep_ended_secs = min(ENDED_RETENTION_SECS, retention_secs)

    def handlers(self) -> dict:
        return {Kind.FLOW_START: self.on_start, Kind.FLOW_GET: self.on_get, Kind.FLOW_CANCEL: self.on_cancel,
                Kind.FLOW_COMPLETE: self.on_complete, Kind.FLOW_CHILD_DONE: self.on_child_done,
                Kind.STEP_START: self.on_step_start, Kind.STEP_RESULT: self.on_step_result,
                Kind.STEP_HEARTBEAT: self.on_heartbeat, Kind.TIMER_FIRE: self.on_timer_fire,
                Kind.CHANNEL_PUBLISH: self.on_publish, Kind.ATTR_GET: self.on_attr_get,
                Kind.ATTR_UPDATE: self.on_attr_update, Kind.TASK_RESULT: self.on_task_result,
                Kind.WORKER_ALIVE: self.on_alive}

    # -- the journal ---------------------------------------------------------------------------

    def record(self, run: Run, kind: str, sync: bool = True, **fields: Any) -> asyncio.Future | None:
        """Apply a record to the run now and append it; SYNC returns the future of its ack."""
        body = {"run": run.run_id, "tenant": run.tenant, "type": kind, "at": time.time(), "exec": run.exec, **fields}
        apply(run, body)
        coro = self.journal_log.append(RecordKind.FLOW, body, run.run_id, sync=True)
        fut = asyncio.ensure_future(coro)
        if not sync:
            run.pending.add(fut)
            fut.add_done_callback(run.pending.discard)
            fut.add_done_callback(_log_failure)
            return None
        return fut

    # -- finding runs --------------------------------------------------------------------------

    async def load(self) -> None:
        """After a start: every open run of this shard, rebuilt from its journal. Flow requests
        wait until this is done (a worker of a run from before the restart may be asking)."""
        while True:
            try:
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
                    self.adopted.add(run_id)
                    self.resume(run)
                break
            except Exception as exc:  # the store may still be starting: keep trying
                self.log.warning("cannot load open flow runs yet (%s); retrying", exc)
                await asyncio.sleep(1.0)
        if mine:
            self.log.info("recovered %d open flow runs", len(mine))
        self.ready.set()

    async def _load_run(self, run_id: str) -> Run | None:
        rows = (await self.query("flow_records", run_id, sync=True))["rows"]
        if not rows:
            return None
        run = replay(run_id, rows)
        run.last_alive = time.monotonic()
        self.runs[run_id] = run
        return run

    async def find(self, run_id: str, tenant: str) -> Run | None:
        await self.ready.wait()
        run = self.runs.get(run_id)
        if run is None:
            run = await self._load_run(run_id)
        if run is None or run.tenant != tenant:
            return None
        return run

    # -- executions ----------------------------------------------------------------------------

    def blocked_on(self, run: Run) -> Op | None:
        """The unfinished sleep, wait or child op the run is parked on, if any."""
        seq = 0
        while True:
            op = run.ops.get(seq)
            if op is None:
                return None
            if not op.done:
                return op if op.op in ("sleep", "wait", "child") else None
            seq += 1

    def dispatch(self, run: Run) -> None:
        """A new execution of the run on some worker."""
        if run.ended:
            return
        self.exec_counter += 1
        run.exec = (self.bus.incarnation << 24) | self.exec_counter
        run.last_alive = time.monotonic()
        run.status = "running"
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
        if op.op == "sleep" or (op.op == "wait" and op.due):
            self.set_timer(run, op)
        if op.op == "wait":
            run.waiting = op.seq
            self._take_message(run, op)

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

    # -- worker requests -----------------------------------------------------------------------

    async def on_step_start(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._current(msg)
        if run is None:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        b = msg.body
        seq, kind, name = b["seq"], b["op"], b["name"]
        op = run.ops.get(seq)
        if op is not None and (op.op != kind or op.name != name):
            self.bus.reply(msg, Kind.STEP_GO, {"action": "fail", "error": (
                f"non-deterministic flow: operation {seq} was {op.op} {op.name!r} when the run first executed, "
                f"and the code now asks for {kind} {name!r}; flow code must take the same path on replay")})
            return
        if op is not None and op.done:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "replay", **_outcome(op)})
            return
        handler = {"step": self._start_step, "sleep": self._start_sleep, "wait": self._start_wait,
                   "child": self._start_child, "attr_set": self._start_attr}.get(kind)
        if handler is None:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "fail", "error": f"unknown operation {kind!r}"})
            return
        await handler(msg, run, seq, op)

    async def _start_step(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        attempts = op.attempts if op is not None else 0
        limit = int(b.get("max_attempts") or 1)
        if attempts >= limit:
            ack = self.record(run, "step.done", seq=seq, name=b["name"], ok=False, attempt=attempts,
                              error=f"retries spent: {attempts} attempts failed ({op.error if op else ''})")
            await ack
            self.bus.reply(msg, Kind.STEP_GO, {"action": "replay", **_outcome(run.ops[seq])})
            return
        ack = self.record(run, "step.started", sync=bool(b.get("sync", True)), seq=seq, name=b["name"],
                          attempt=attempts + 1)
        if ack is not None:
            await ack
        body = {"action": "run", "attempt": attempts + 1}
        if run.ops[seq].heartbeat is not None:
            body["heartbeat"] = run.ops[seq].heartbeat
        self.bus.reply(msg, Kind.STEP_GO, body)

    async def _start_sleep(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        if op is None:
            await self.record(run, "sleep", seq=seq, name=msg.body["name"], due=float(msg.body.get("due") or 0))
            op = run.ops[seq]
        if time.time() >= op.due:
            await self.record(run, "op.done", seq=seq, op="sleep", ok=True)
            self.bus.reply(msg, Kind.STEP_GO, {"action": "continue"})
            return
        self.set_timer(run, op)
        self.bus.reply(msg, Kind.STEP_GO, {"action": _park(run)})

    async def _start_wait(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        if op is None:
            timeout = b.get("timeout")
            await self.record(run, "wait", seq=seq, name=b["name"], channel=b["channel"],
                              due=time.time() + float(timeout) if timeout else 0.0)
            op = run.ops[seq]
        if await self._take_message(run, op):
            self.bus.reply(msg, Kind.STEP_GO, {"action": "continue", **_outcome(op)})
            return
        if op.due:
            self.set_timer(run, op)
        self.bus.reply(msg, Kind.STEP_GO, {"action": _park(run)})

    async def _take_message(self, run: Run, op: Op) -> bool:
        queue = run.channels.get(op.channel)
        if not queue or op.done:
            return False
        msg_seq, message = queue[0]
        first = self.record(run, "message.taken", seq=op.seq, channel=op.channel, msg_seq=msg_seq)
        await asyncio.gather(first, self.record(run, "op.done", seq=op.seq, op="wait", ok=True, result=message))
        return True

    async def _start_child(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        if op is None:
            child = b.get("child") or f"{run.run_id}.{seq}"
            await self.record(run, "child.started", seq=seq, name=b["name"], child=child)
            op = run.ops[seq]
        self.bus.reply(msg, Kind.STEP_GO, {"action": _park(run)})
        asyncio.ensure_future(self._start_child_run(run, op, b.get("input")))

    async def _start_child_run(self, run: Run, op: Op, child_input: Any) -> None:
        try:
            reply = await self.bus.request(actor_name(op.child, self.shards), Kind.FLOW_START, {
                "flow": op.name, "run_id": op.child, "tenant": run.tenant, "input": child_input,
                "parent": run.run_id, "parent_seq": op.seq, "parent_actor": self.bus.name}, timeout=30.0)
        except BusError as exc:
            self.log.warning("could not start child %s of %s: %s (retried on the next dispatch)", op.child,
                             run.run_id, exc)
            return
        status = reply.body["status"]
        if status in ("completed", "failed", "cancelled") and not op.done:
            await self._child_ended(run, op.seq, status == "completed", reply.body.get("result"),
                                    reply.body.get("error", f"child flow {status}"))

    async def _start_attr(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        first = self.record(run, "attr.set", key=b["key"], value=b.get("value"), seq=seq)
        await asyncio.gather(first, self.record(run, "op.done", seq=seq, op="attr_set", name=b["name"], ok=True))
        self.bus.reply(msg, Kind.STEP_GO, {"action": "continue"})

    async def on_step_result(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._current(msg)
        if run is None:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "superseded"})
            return
        b = msg.body
        sync = bool(b.get("sync", True))
        if b["ok"]:
            ack = self.record(run, "step.done", sync, seq=b["seq"], name=b.get("name", ""), ok=True,
                              result=b.get("result"), attempt=b["attempt"])
        elif b.get("final"):
            ack = self.record(run, "step.done", sync, seq=b["seq"], name=b.get("name", ""), ok=False,
                              error=b.get("error", ""), attempt=b["attempt"])
        else:
            ack = self.record(run, "step.failed", sync, seq=b["seq"], attempt=b["attempt"], error=b.get("error", ""))
        if ack is not None:
            await ack
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})

    def on_heartbeat(self, msg: Message) -> None:
        run = self.runs.get(msg.body["run_id"])
        if run is not None and run.exec == msg.body["exec"] and not run.ended:
            run.last_alive = time.monotonic()
            self.record(run, "step.heartbeat", sync=False, seq=msg.body["seq"], attempt=msg.body["attempt"],
                        value=msg.body.get("value"))

    async def on_complete(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._current(msg)
        if run is None:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "superseded"})
            return
        if run.pending:  # the run's own end waits for its ASYNC commits
            await asyncio.gather(*list(run.pending), return_exceptions=True)
        b = msg.body
        if b["ok"]:
            await self.end(run, "completed", result=b.get("result"))
        else:
            await self.end(run, "failed", error=b.get("error") or "the flow raised an error")
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})

    async def end(self, run: Run, status: str, result: Any = None, error: str = "") -> None:
        fields: dict[str, Any] = {"status": status}
        if status == "completed":
            fields["result"] = result
        else:
            fields["error"] = error
        await self.record(run, "run.ended", **fields)
        _wake(run, None)
        if run.parent:
            asyncio.ensure_future(self._notify_parent(run))

    async def _notify_parent(self, run: Run) -> None:
        body = {"run_id": run.parent, "seq": run.parent_seq, "child": run.run_id, "ok": run.status == "completed"}
        if run.status == "completed":
            body["result"] = run.result
        else:
            body["error"] = run.error or f"child flow {run.status}"
        try:
            await self.bus.request(run.parent_actor or actor_name(run.parent, self.shards), Kind.FLOW_CHILD_DONE,
                                   body, timeout=60.0, session=run.parent)
        except BusError as exc:
            self.log.warning("parent %s of %s did not hear the child ended: %s", run.parent, run.run_id, exc)

    async def on_child_done(self, msg: Message) -> None:
        await self.ready.wait()
        b = msg.body
        run = self.runs.get(b["run_id"]) or await self._load_run(b["run_id"])
        if run is not None and not run.ended:
            await self._child_ended(run, b["seq"], b["ok"], b.get("result"), b.get("error", ""))
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})

    async def _child_ended(self, run: Run, seq: int, ok: bool, result: Any, error: str) -> None:
        op = run.ops.get(seq)
        if op is None or op.done:
            return
        await self.record(run, "op.done", seq=seq, op="child", ok=ok, result=result, error=error)
        self.dispatch(run)

    def on_timer_fire(self, msg: Message) -> None:
        run = self.runs.get(msg.body["run_id"])
        if run is not None:
            asyncio.ensure_future(self._timer_fired(run, int(msg.body["timer_id"].rsplit(":", 1)[1])))

    async def _timer_fired(self, run: Run, seq: int) -> None:
        op = run.ops.get(seq)
        if run.ended or op is None or op.done or time.time() < op.due:
            return
        if op.op == "sleep":
            await self.record(run, "op.done", seq=seq, op="sleep", ok=True)
        else:
            await self.record(run, "op.done", seq=seq, op="wait", ok=False, error="timeout")
        self.dispatch(run)

    def on_alive(self, msg: Message) -> None:
        now = time.monotonic()
        for run_id, exec_ in msg.body["runs"]:
            run = self.runs.get(run_id)
            if run is not None and (run.exec == exec_ or (run_id in self.adopted and exec_ > run.exec)):
                run.last_alive = now
                self.run_workers[run_id] = msg.src
        for task_id in msg.body["tasks"]:
            entry = self.tasks.get(task_id)
            if entry is not None:
                entry[2] = now
                entry[3] = msg.src

    def cancel_task(self, task_id: str) -> None:
        """Stop a task wherever it is: on its worker, or still in the scheduler's queue."""
        entry = self.tasks.pop(task_id, None)
        if entry is None:
            return
        if entry[3]:
            self.bus.send(entry[3], Kind.TASK_CANCEL, {"task_id": task_id})
        self.bus.send(SCHEDULER, Kind.TASK_CANCEL, {"task_id": task_id})
        if not entry[0].done():
            entry[0].cancel()

    # -- tasks for workers (update handlers, tools) --------------------------------------------

    def submit_task(self, kind: str, name: str, tenant: str, payload: Any, run_id: str = "") -> asyncio.Future:
        self.task_counter += 1
        task_id = f"{self.bus.name}.{self.bus.incarnation:x}.{self.task_counter}"
        body = {"task_id": task_id, "kind": kind, "name": name, "tenant": tenant, "payload": payload}
        if run_id:
            body["run_id"] = run_id
        fut = asyncio.get_running_loop().create_future()
        self.tasks[task_id] = [fut, body, time.monotonic(), ""]
        fut.add_done_callback(lambda _: self.tasks.pop(task_id, None))
        self.bus.send(SCHEDULER, Kind.TASK_SUBMIT, body, session=run_id)
        return fut

    def on_task_result(self, msg: Message) -> None:
        entry = self.tasks.get(msg.body["task_id"])
        if entry is not None and not entry[0].done():
            if msg.body["ok"]:
                entry[0].set_result(msg.body.get("result"))
            else:
                entry[0].set_exception(TaskFailed(msg.body.get("error") or "the task failed"))
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})

    # -- clients --------------------------------------------------------------------------------

    async def on_start(self, msg: Message) -> None:
        await self.ready.wait()
        b = msg.body
        run_id = b["run_id"]
        run = self.runs.get(run_id)
        if run is None:
            pending = self.starting.get(run_id)
            if pending is not None:
                await asyncio.shield(pending)
                run = self.runs.get(run_id)
            else:
                fut = self.starting[run_id] = asyncio.get_running_loop().create_future()
                try:
                    run = await self._load_run(run_id) if not b.get("new") else None
                    if run is None:
                        run = await self._create(b)
                        self.bus.reply(msg, Kind.FLOW_RUN, {**run.summary(), "created": True})
                        return
                finally:
                    del self.starting[run_id]
                    fut.set_result(None)
        if run.tenant != b["tenant"]:
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict",
                                                "error": "this run id belongs to another tenant"})
            return
        self.bus.reply(msg, Kind.FLOW_RUN, {**run.summary(), "created": False})

    async def _create(self, b: dict) -> Run:
        run = Run(b["run_id"], b["flow"], b["tenant"])
        self.runs[run.run_id] = run
        fields = {"flow": b["flow"], "input": b.get("input")}
        if b.get("parent"):
            fields.update(parent=b["parent"], parent_seq=b["parent_seq"], parent_actor=b.get("parent_actor", ""))
        await self.record(run, "run.started", **fields)
        self.dispatch(run)
        return run

    async def on_get(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"])
        if run is None:
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": msg.body["run_id"], "status": "unknown", "code": "not_found",
                                                "error": "no such run"})
            return
        wait = float(msg.body.get("wait") or 0.0)
        until = msg.body.get("until") if msg.body.get("until") in WAITABLE else None
        if wait and not run.ended and run.status != until:
            waiter = asyncio.get_running_loop().create_future()
            run.waiters.append((until, waiter))
            try:
                await asyncio.wait_for(asyncio.shield(waiter), wait)
            except asyncio.TimeoutError:
                pass
            finally:
                run.waiters = [w for w in run.waiters if w[1] is not waiter]
        self.bus.reply(msg, Kind.FLOW_RUN, run.summary())

    async def on_cancel(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"])
        if run is None:
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": msg.body["run_id"], "status": "unknown", "code": "not_found",
                                                "error": "no such run"})
            return
        if not run.ended:
            await self.end(run, "cancelled", error="cancelled by request")
            worker = self.run_workers.pop(run.run_id, "")
            if worker:  # stop its execution now rather than at its next step
                self.bus.send(worker, Kind.TASK_CANCEL, {"task_id": f"{run.run_id}#{run.exec}"})
        self.bus.reply(msg, Kind.FLOW_RUN, run.summary())

    async def on_publish(self, msg: Message) -> None:
        b = msg.body
        run = await self.find(b["run_id"], b["tenant"])
        if run is None:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "not_found", "error": "no such run"})
            return
        if run.ended:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "ended", "error": f"the run is {run.status}"})
            return
        # The message and, if a wait is for it, its taking go in one batch (one fsync, not two):
        # both come from this actor to one writer, in order, so the taking is never durable alone.
        kept = self.record(run, "message", channel=b["channel"], msg_seq=run.msg_counter + 1, message=b.get("message"))
        waiting = run.ops.get(run.waiting) if run.waiting is not None else None
        if waiting is not None and waiting.channel == b["channel"] and await self._take_message(run, waiting):
            self.dispatch(run)
        await kept
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})

    async def on_attr_get(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"])
        if run is None:
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": False, "code": "not_found", "error": "no such run"})
            return
        keys = msg.body.get("keys")
        values = run.attrs if not keys else {k: run.attrs[k] for k in keys if k in run.attrs}
        self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "values": values})

    async def on_attr_update(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"])
        if run is None:
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": False, "code": "not_found", "error": "no such run"})
            return
        run.updates.append(msg)
        if run.updating:
            return
        run.updating = True
        try:
            while run.updates:
                await self._update(run, run.updates.popleft())
        finally:
            run.updating = False

    async def _update(self, run: Run, msg: Message) -> None:
        """One read-modify-write under the run's lock (the loop in on_attr_update)."""
        b = msg.body
        key = b["key"]
        try:
            value = await self.submit_task("update", b["handler"], run.tenant,
                                           {"key": key, "value": run.attrs.get(key), "arg": b.get("arg")}, run.run_id)
        except TaskFailed as exc:
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "code": "handler_failed", "error": str(exc)})
            return
        await self.record(run, "attr.set", key=key, value=value, seq=-1)
        self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "values": {key: value}})

    # -- the watchdog ---------------------------------------------------------------------------

    async def watchdog(self) -> None:
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now, wall = time.monotonic(), time.time()
            resync = now - last_resync > RESYNC_SECS
            if resync:
                last_resync = now
            for run in list(self.runs.values()):
                if run.flow == "turn":  # turns run in their actor, not on workers
                    if run.ended and now - run.last_alive > self.keep_ended_secs:
                        del self.runs[run.run_id]
                    continue
                if run.ended:
                    if now - run.last_alive > self.keep_ended_secs and not run.updating:
                        del self.runs[run.run_id]
                    continue
                op = self.blocked_on(run)
                if op is None:
                    if now - run.last_alive > EXEC_GRACE_SECS:
                        self.dispatch(run)  # its worker died, or its task never started
                elif op.due and wall > op.due + TIMER_GRACE_SECS:
                    asyncio.ensure_future(self._timer_fired(run, op.seq))  # the scheduler's notice never came
                elif op.due and resync:
                    self.set_timer(run, op)
            for task_id, entry in list(self.tasks.items()):
                if now - entry[2] > EXEC_GRACE_SECS:
                    entry[2] = now
                    self.bus.send(SCHEDULER, Kind.TASK_SUBMIT, entry[1], session=entry[1].get("run_id", ""))

    def stats(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for run in self.runs.values():
            counts[run.status] = counts.get(run.status, 0) + 1
        return {"runs": counts, "tasks_waiting": len(self.tasks)}


def _park(run: Run) -> str:
    """The run waits for a timer, a message or a child: this execution ends (unless the run was
    cancelled meanwhile, in which case it is simply over)."""
    if run.ended:
        return "abort"
    run.status = "suspended"
    _wake(run, "suspended")
    return "suspend"


def _wake(run: Run, status: str | None) -> None:
    """Answer the callers waiting for this status (None: the run ended — everyone)."""
    keep = []
    for until, waiter in run.waiters:
        if status is None or until == status:
            if not waiter.done():
                waiter.set_result(None)
        else:
            keep.append((until, waiter))
    run.waiters = keep


def _outcome(op: Op) -> dict[str, Any]:
    return {"ok": True, "result": op.result} if op.ok else {"ok": False, "error": op.error}


def _log_failure(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logging.getLogger("agent-os.flows").error("an ASYNC journal record was not written: %s", fut.exception())
