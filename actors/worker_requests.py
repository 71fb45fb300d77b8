"""What workers ask of the runs an actor owns while executing them: may this step start (or
here is its recorded outcome), its result, heartbeats, the run's completion, a child's end, a
timer that fired, and which executions are still alive.

A mixin of `actors.flow_runs.Flows`, which owns the runs, their journal and their executions:
this module journals each operation through `record` (SYNC: before answering; ASYNC: after) and
answers `abort` to a superseded execution. A run that sleeps, waits or has a child parks: its
execution ends and it is dispatched again when what it waits for happens. It never answers
callers (actors.run_requests does).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from actors.flow_state import EMITTED, MAX_WAIT_CHANNELS, Op, Run, next_message
from actors.schedules import TICK_SEQ
from agentos.running_time import wait_running
from agentos.tenant_ids import external, internal
from broker.client import BusError
from broker.protocol import Kind, Message, ProtocolError
from broker.sharding import actor_name


UNKNOWN_TASK_GRACE_SECS = 2.0
RESULTS_DUE_SECS = 12.0   # two of the worker's 5 s attempts at an ASYNC result (actors/worker_process.py)
UNKNOWN_TASK_FORGET_SECS = 60.0   # a task not reported for this long is forgotten (it ended)
# a step whose workers stopped cleanly under it this often fails: no deploy schedule cuts one
# step that often, but code that stops its own worker (SIGTERM to itself) would go on forever
MAX_INTERRUPTED_ATTEMPTS = 20


class WorkerRequests:
    async def on_step_start(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._current(msg)
        if run is None:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        b = msg.body
        seq, kind, name = b["seq"], b["op"], b["name"]
        op = run.ops.get(seq)
        if kind == "patch" and op is not None and op.op != "patch":
            # `ctx.patched` where the code before the change recorded an operation of its own (one
            # in flight when its execution ended): the run keeps to the old path
            self.bus.reply(msg, Kind.STEP_GO, {"action": "skip"})
            return
        if op is not None and (op.op != kind or op.name != name):
            self.bus.reply(msg, Kind.STEP_GO, {"action": "fail", "error": (
                f"non-deterministic flow: operation {seq} was {op.op} {op.name!r} when the run first executed, "
                f"and the code now asks for {kind} {name!r}; flow code must take the same path on replay")})
            return
        if op is not None and op.done:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "replay", **_outcome(op)})
            return
        handler = {"step": self._start_step, "sleep": self._start_sleep, "wait": self._start_wait,
                   "child": self._start_child, "attr_set": self._start_attr, "patch": self._start_patch,
                   "send": self._start_send, "publish": self._start_publish, "emit": self._start_emit}.get(kind)
        if handler is None:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "fail", "error": f"unknown operation {kind!r}"})
            return
        if kind in ("sleep", "wait", "child") and not await self._results_in(run, msg):   # it may park
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        await handler(msg, run, seq, op)

    async def _results_in(self, run: Run, msg: Message) -> bool:
        """Before the run parks or ends: wait for the ASYNC results its worker sent before this
        request and has no answer for (`results_due`). They are normally here already, on the one
        ordered path from that worker; one the broker bounced (this actor was stalled past its
        peer timeout) comes again seconds later, after this request. Parked or ended without it,
        the run's journal kept a hole there, and its next execution ran the step again. False:
        the execution was superseded meanwhile."""
        due = [seq for seq in msg.body.get("results_due") or () if type(seq) is int]
        exec_ = run.exec
        # (of running time: an actor stopped for longer would wake to the results unread and not wait)
        await wait_running(lambda: run.ended or run.exec != exec_
                           or all(seq in run.ops and run.ops[seq].done for seq in due), RESULTS_DUE_SECS)
        return not run.ended and run.exec == exec_

    async def _start_step(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        attempts = op.attempts if op is not None else 0
        failed = attempts - (op.interrupted if op is not None else 0)
        limit = int(b.get("max_attempts") or 1)
        error = None
        if failed >= limit:
            error = f"retries spent: {failed} attempts failed ({op.error if op else ''})"
        elif op is not None and op.interrupted >= MAX_INTERRUPTED_ATTEMPTS:
            error = (f"its workers stopped under it {op.interrupted} times: its code may stop the worker "
                     "process (a deploy that often would never let it finish either)")
        if error is not None:
            ack = self.record(run, "step.done", seq=seq, name=b["name"], ok=False, attempt=attempts, error=error)
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
            channels = b.get("channels")
            if channels is not None and not (0 < len(channels) <= MAX_WAIT_CHANNELS and all(
                    type(c) is str and c for c in channels) and len(set(channels)) == len(channels)):
                self.bus.reply(msg, Kind.STEP_GO, {"action": "fail", "error": (
                    f"a wait listens to 1 to {MAX_WAIT_CHANNELS} channels, each named once by a non-empty string")})
                return
            timeout, due = b.get("timeout"), b.get("due")   # (due: from the call, on the worker's clock)
            due = 0.0 if timeout is None else float(due) if due is not None and math.isfinite(due) and due > 0 \
                else time.time() + float(timeout)
            await self.record(run, "wait", seq=seq, name=b["name"], channel=b["channel"], due=due,
                              **({"channels": channels} if channels is not None else {}))
            op = run.ops[seq]
        if await self._take_message(run, op):
            self.bus.reply(msg, Kind.STEP_GO, {"action": "continue", **_outcome(op)})
            return
        if op.due:
            self.set_timer(run, op)
        self.bus.reply(msg, Kind.STEP_GO, {"action": _park(run)})

    async def _take_message(self, run: Run, op: Op) -> bool:
        channel = next_message(run, op)
        if channel is None or op.done:
            return False
        msg_seq, message = run.channels[channel][0]
        first = self.record(run, "message.taken", seq=op.seq, channel=channel, msg_seq=msg_seq)
        # (a wait on several channels is answered which one the message came on)
        result = [channel, message] if op.channels else message
        await asyncio.gather(first, self.record(run, "op.done", seq=op.seq, op="wait", ok=True, result=result))
        return True

    async def _start_child(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        if op is None:   # a child the flow names is its run's tenant's (unless named as such already)
            named = b.get("child")
            child = f"{run.run_id}.{seq}" if not named else named if external(run.tenant, named) != named \
                else internal(run.tenant, named)
            await self.record(run, "child.started", seq=seq, name=b["name"], child=child)
            op = run.ops[seq]
        self.bus.reply(msg, Kind.STEP_GO, {"action": _park(run)})
        self.bus.spawn(self._start_child_run(run, op, b.get("input"),
                                             {f: b[f] for f in ("queue", "priority", "queue_key") if b.get(f)}))

    async def _start_child_run(self, run: Run, op: Op, child_input: Any, queued: dict | None = None) -> None:
        start = {"flow": op.name, "run_id": op.child, "tenant": run.tenant, "input": child_input,
                 "parent": run.run_id, "parent_seq": op.seq, "parent_actor": self.bus.name}
        if queued and queued.get("queue"):   # its queue, and there its priority and key
            start.update(queued)
        try:
            reply = await self.bus.request(actor_name(op.child, self.shards), Kind.FLOW_START, start, timeout=30.0)
        except BusError as exc:
            self.log.warning("could not start child %s of %s: %s (retried on the next dispatch)", op.child,
                             run.run_id, exc)
            return
        status = reply.body["status"]
        if reply.body.get("code") == "conflict" and not op.done:   # its run id names another flow's run
            await self.or_reload(run, self._child_ended(run, op.seq, False, None,
                                                        reply.body.get("error", "run id in use")))
        elif status in ("completed", "failed", "cancelled") and not op.done:
            await self.or_reload(run, self._child_ended(run, op.seq, status == "completed", reply.body.get("result"),
                                                        reply.body.get("error", f"child flow {status}")))

    async def _start_emit(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        """`ctx.emit`: the value is the op's outcome; its readers hear of it once it is durable."""
        await self.record(run, "op.done", seq=seq, op="emit", name=msg.body["name"], ok=True,
                          result=msg.body.get("value"))
        _wake(run, EMITTED)
        self.bus.reply(msg, Kind.STEP_GO, {"action": "continue"})

    async def _start_attr(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        b = msg.body
        first = self.record(run, "attr.set", key=b["key"], value=b.get("value"), seq=seq)
        await asyncio.gather(first, self.record(run, "op.done", seq=seq, op="attr_set", name=b["name"], ok=True))
        self.bus.reply(msg, Kind.STEP_GO, {"action": "continue"})

    async def _start_patch(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        """`ctx.patched` at the end of the run's history: the mark says the run takes the new path."""
        await self.record(run, "op.done", seq=seq, op="patch", name=msg.body["name"], ok=True)
        self.bus.reply(msg, Kind.STEP_GO, {"action": "continue"})

    async def on_step_result(self, msg: Message) -> None:
        await self.ready.wait()
        run = self._current(msg)
        if run is None:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "superseded"})
            return
        b = msg.body
        sync = bool(b.get("sync", True))
        if b.get("interrupted"):
            op = run.ops.get(b["seq"])
            if op is not None and not op.done and op.attempts == b["attempt"] and op.interrupted_last < b["attempt"]:
                ack = self.record(run, "step.interrupted", seq=b["seq"], attempt=b["attempt"])
                if ack is not None:
                    await ack
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})
            return
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
        if not await self._results_in(run, msg):
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "superseded"})
            return
        if run.pending:  # the run's own end waits for its records in flight (its ASYNC steps')
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
        if status == "failed":   # (a cancel told them before its end; a completed run has none open)
            self.stop_children(run, f"its parent {run.run_id} failed")
        if run.parent:
            self.bus.spawn(self._notify_parent(run))

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
        # Children started at once: the run goes on once the last has ended (whatever comes after
        # them waits for them), and not under an execution that went on past them meanwhile (a
        # replay that found them ended): that one is not cut off, nor its steps run twice. (One
        # that died so is dispatched again by the watchdog, as any.)
        if not run.executing and not self.waits_on_children(run):
            self.dispatch(run)

    def on_timer_fire(self, msg: Message) -> None:
        run = self.runs.get(msg.body["run_id"])
        if run is not None:
            self.bus.spawn(self.or_reload(run, self._timer_fired(run, int(msg.body["timer_id"].rsplit(":", 1)[1]))))

    async def _timer_fired(self, run: Run, seq: int) -> None:
        if seq == TICK_SEQ:   # a schedule's next time (actors/schedules.py)
            if not run.ended:
                self.tick_schedule(run, time.time(), resync=False)
            return
        if seq == -1:   # a delayed start's (actors/flow_runs.py blocked_on): unless it ran already
            if not run.ended and run.exec == 0 and not run.waits_to_start(time.time()):
                self.dispatch(run)
            return
        op = run.ops.get(seq)
        if run.ended or op is None or op.done or time.time() < op.due:
            return
        if op.op == "sleep":
            await self.record(run, "op.done", seq=seq, op="sleep", ok=True)
        else:
            await self.record(run, "op.done", seq=seq, op="wait", ok=False, error="timeout")
        self.dispatch(run)

    def on_alive(self, msg: Message) -> None:
        if not (all(type(e) is list and len(e) == 2 and type(e[0]) is str and type(e[1]) is int
                    for e in msg.body["runs"]) and all(type(t) is str for t in msg.body["tasks"])):
            raise ProtocolError("worker.alive: runs are [run id, execution] pairs, tasks their ids")
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
            elif self.ready.is_set():
                self._unknown_task(msg.src, task_id, now)
        if self.unknown_tasks:
            self.unknown_tasks = {t: at for t, at in self.unknown_tasks.items() if now - at < UNKNOWN_TASK_FORGET_SECS}

    def _unknown_task(self, worker: str, task_id: str, now: float) -> None:
        """A worker runs a task this actor no longer waits for: the cancel was lost (the broker
        bounces what is sent to a worker stalled past its peer timeout), and a tool that never
        returned held the worker's slot for good. Cancelled again at each of its reports, after a
        grace for one whose result has just come (the worker lists it until its reply is back)."""
        if now - self.unknown_tasks.setdefault(task_id, now) >= UNKNOWN_TASK_GRACE_SECS:
            self.bus.send(worker, Kind.TASK_CANCEL, {"task_id": task_id})


def _park(run: Run) -> str:
    """The run waits for a timer, a message or a child: this execution ends (unless the run was
    cancelled meanwhile, in which case it is simply over)."""
    if run.ended:
        return "abort"
    run.status = "suspended"
    run.executing = False
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

