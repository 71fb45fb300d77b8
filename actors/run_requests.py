"""What callers ask of the runs an actor owns: start one (a repeated start returns the same run)
or a fork of one (actors/run_forks.py), read its status (optionally waiting for its end or its
suspension), cancel it, read its attributes, and lock-and-update one attribute (publishing to
its channels: actors/run_messages.py).

A mixin of `actors.flow_runs.Flows`, which owns the runs, their journal and their executions;
this module only answers requests about them, through what `Flows` provides (`find`, `record`,
`end`, `dispatch`, `submit_task`, `_take_message`, `_load_run`, `_create`'s state). It never
runs flow code and never talks to workers except through a task.
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Awaitable, Callable

from actors.flow_state import EMITTED, WAITABLE, Run, value_bytes
from actors.persistence import StorageUnavailable
from actors.run_forks import ForkRefused, fork_fields
from broker.protocol import STEPS_PAGE_BYTES, Kind, Message, past_deadline
from broker.sharding import SCHEDULER, is_actor_name
from storage.log_client import LogWriteError


# An update holds its run's lock until its handler has run; the gateway gives up on the request
# after twice the flow client's 30 s timeout, so the lock is given up before that.
UPDATE_WAIT_SECS = 50.0


def refused(exc: LogWriteError, what: str) -> dict:
    """The error part of a reply to a request whose journal record a writer refused (a full disk):
    the caller hears it at once (the gateway answers 507), and the run stays as its journal has it."""
    return {"code": exc.code, "error": f"{what}: {exc}"}


def _unavailable(kind: Kind, body: dict, exc: StorageUnavailable) -> dict:
    head = {Kind.FLOW_RUN: {"run_id": body.get("run_id"), "status": "error"}, Kind.FLOW_ACK: {"ok": False},
            Kind.ATTR_VALUES: {"found": False}, Kind.FLOW_OPS: {"found": False}}[kind]
    return {**head, "code": "unavailable", "error": f"the run's journal could not be read: {exc}"}


class TaskFailed(RuntimeError):
    """A task (an update handler, a tool) failed on its worker, after its retries."""


class RunRequests:
    def store_away(self, handler: Callable[[Message], Awaitable[None]],
                   kind: Kind) -> Callable[[Message], Awaitable[None]]:
        """`handler`, for when a run it needs is not in memory and writer/store, which reads its
        journal back, does not answer (restarting, stalled; actors/persistence.py): the caller
        hears `unavailable` in a `kind` reply at once (an HTTP client: 503) rather than nothing
        until its own timeout, and the log says so in a WARNING — no bug, no traceback (it was
        "handler failed" with one, in a chaos run whose writer/store was down for 30 s). Workers'
        requests concern runs in memory only."""
        async def handle(msg: Message) -> None:
            try:
                await handler(msg)
            except StorageUnavailable as exc:
                if (more := self.store_away_said.due()) is not None:
                    self.log.warning("%s for run %s not served: %s%s", msg.kind.value, msg.body.get("run_id"), exc,
                                     more)
                self.bus.reply(msg, kind, _unavailable(kind, msg.body, exc))
        return handle

    def in_time(self, handler: Callable[[Message], Awaitable[None]]) -> Callable[[Message], Awaitable[None]]:
        """`handler`, for writes whose caller names when it gives up: one that arrives past that
        is dropped unanswered (broker/protocol.py past_deadline)."""
        async def handle(msg: Message) -> None:
            if not self.given_up(msg, "came"):
                await handler(msg)
        return handle

    def given_up(self, msg: Message, when: str) -> bool:
        """Whether `msg`'s caller has given up on it (broker/protocol.py past_deadline), said in a
        WARNING. Asked on arrival (in_time) and again once the run is found, before anything is
        committed: finding it can wait on writer/store's read of its journal, or on a stall, past
        the deadline, and a write done then would be done again by the client's retry."""
        if not past_deadline(msg.body, time.time()):
            return False
        if (more := self.given_up_said.due()) is not None:
            self.log.warning("%s for run %s %s after its caller gave up; not done%s", msg.kind.value,
                             msg.body.get("run_id") or msg.body.get("key"), when, more)
        return True

    async def on_start(self, msg: Message) -> None:
        await self.ready.wait()
        b = msg.body
        run_id = b["run_id"]
        if b.get("parent") and (type(b.get("parent_seq")) is not int
                                or not (b.get("parent_actor", "") == "" or is_actor_name(b["parent_actor"]))):
            # (a parent's actor that is no actor's name failed the child's end: nobody to tell)
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict",
                                                "error": "a child's start names its place in its parent (parent_seq) "
                                                         "and, if any, its parent's actor (parent_actor: actor/<n>)"})
            return
        if not (b.get("fork_of") or b.get("flow")) or (b.get("fork_of") and not (
                b.get("fork_seq") is None or (type(b["fork_seq"]) is int and b["fork_seq"] >= 0))):
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict",
                                                "error": "a start names its flow; a fork, its run (fork_of) and, "
                                                         "if any, a seq >= 0 (fork_seq)"})
            return
        if any(b.get(f) is not None and not (math.isfinite(b[f]) and b[f] >= 0 and not b.get("fork_of"))
               for f in ("start_at", "timeout_secs")):
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict",
                                                "error": "a delayed start names a finite time (start_at), a timeout "
                                                         "a finite number of seconds; a fork takes neither"})
            return
        run = self.runs.get(run_id)
        if run is None:
            pending = self.starting.get(run_id)
            if pending is not None:
                await asyncio.shield(pending)
                run = self.runs.get(run_id)
                if run is None:
                    self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "unavailable",
                                                        "error": "the same start, asked at once, failed: try again"})
                    return
            else:
                fut = self.starting[run_id] = asyncio.get_running_loop().create_future()
                try:
                    try:
                        run = await self._load_run(run_id, write=True) if not b.get("new") else None
                        if run is None:
                            if self.given_up(msg, "was found new"):
                                return
                            run = await self._create(b)
                            self.bus.reply(msg, Kind.FLOW_RUN, {**run.summary(), "created": True})
                            return
                    except LogWriteError as exc:
                        self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error",
                                                            **refused(exc, "run not started")})
                        return
                    except ForkRefused as exc:
                        self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": exc.code,
                                                            "error": exc.message})
                        return
                finally:
                    del self.starting[run_id]
                    fut.set_result(None)
        if run.tenant != b["tenant"]:
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict",
                                                "error": "this run id belongs to another tenant"})
            return
        if b.get("fork_of"):
            if run.forked_from != b["fork_of"] or b.get("fork_seq") not in (None, run.fork_seq):
                self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict", "error":
                               "this run is not that fork (the same Idempotency-Key or run_id names the same request)"})
                return
        elif run.flow != b["flow"] or (run.input != b.get("input") and not b.get("parent")):   # a parent re-asks
            # the same key or run id with another request: a mistake the caller should hear of, not
            # an answer about a run it did not ask for
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run_id, "status": "error", "code": "conflict", "error":
                           f"this run was started with {'another flow' if run.flow != b['flow'] else 'another input'}"
                           " (the same Idempotency-Key or run_id names the same request)"})
            return
        self.bus.reply(msg, Kind.FLOW_RUN, {**run.summary(), "created": False})

    async def _create(self, b: dict) -> Run:
        if b.get("fork_of"):   # read from writer/store: the original may be another actor's
            rows = (await self.query("flow_records", b["fork_of"], sync=True))["rows"]
            fields = fork_fields(b["fork_of"], rows, b["tenant"], b.get("fork_seq"))
            if b.get("queue"):
                fields["queue"] = b["queue"]
        else:
            fields = {"flow": b["flow"], "input": b.get("input")}
            fields.update({f: b[f] for f in ("start_at", "schedule", "scheduled_at", "timeout_secs", "queue",
                                             "priority", "queue_key") if b.get(f)})
        if b.get("parent"):
            fields.update(parent=b["parent"], parent_seq=b["parent_seq"], parent_actor=b.get("parent_actor", ""))
        run = Run(b["run_id"], fields["flow"], b["tenant"])
        self.runs[run.run_id] = run
        try:
            await self.record(run, "run.started", **fields)
        except LogWriteError:
            del self.runs[run.run_id]   # it never began
            raise
        if self.blocked_on(run) is None:
            self.dispatch(run)
        else:   # a delayed start: its timer dispatches it
            self.resume(run)
        return run

    async def on_get(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"], read=True)
        if run is None:
            self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": msg.body["run_id"], "status": "unknown", "code": "not_found",
                                                "error": "no such run"})
            return
        wait = float(msg.body.get("wait") or 0.0)
        wait = min(wait, 3600.0) if wait > 0 else 0.0   # (NaN: no wait; the gateway allows at most 60 s)
        until = msg.body.get("until") if msg.body.get("until") in WAITABLE else None
        if wait and not run.ended and run.status != until and not run.stale:   # (a copy never changes)
            await _until(run, until, wait)
        self.bus.reply(msg, Kind.FLOW_RUN, run.summary())

    async def on_steps(self, msg: Message) -> None:
        """A page of the run's operations in order, after seq `after`: at most `limit`, and past
        the first no more than STEPS_PAGE_BYTES of their values."""
        run = await self.find(msg.body["run_id"], msg.body["tenant"], read=True)
        if run is None:
            self.bus.reply(msg, Kind.FLOW_OPS, {"found": False, "code": "not_found", "error": "no such run"})
            return
        after = -1 if msg.body.get("after") is None else msg.body["after"]
        limit = max(1, min(msg.body.get("limit") or 100, 1000))
        only = msg.body.get("only")

        def page() -> list[int]:
            return sorted(seq for seq, op in run.ops.items() if seq > after and (only is None or op.op == only))
        seqs = page()
        wait = float(msg.body.get("wait") or 0.0)
        if only == "emit" and not seqs and 0 < wait and not run.ended and not run.stale:   # (NaN: no wait)
            await _until(run, EMITTED, min(wait, 3600.0))
            seqs = page()
        ops: list[dict] = []
        size = 0
        for seq in seqs:
            op = run.ops[seq]
            size += value_bytes({"result": op.result, "value": op.heartbeat})
            if len(ops) == limit or (ops and size > STEPS_PAGE_BYTES):
                self.bus.reply(msg, Kind.FLOW_OPS, {"found": True, "ops": ops, "next_after": ops[-1]["seq"],
                                                    "status": run.status})
                return
            ops.append(op.view(run.ended))
        self.bus.reply(msg, Kind.FLOW_OPS, {"found": True, "ops": ops, "status": run.status})

    async def find_to_write(self, msg: Message, kind: Kind, what: str, refused_head: dict,
                            missing_head: dict) -> Run | None:
        """The run a write names; None once its caller is answered that the run is not there
        (`missing_head` begins that reply), or that it is on its way back from its journal while
        the disk is still full (`refused_head`: "<what>: <the writer's error>")."""
        try:
            run = await self.find(msg.body["run_id"], msg.body["tenant"])
        except LogWriteError as exc:
            self.bus.reply(msg, kind, {**refused_head, **refused(exc, what)})
            return None
        if run is None:
            self.bus.reply(msg, kind, {**missing_head, "code": "not_found", "error": "no such run"})
        return run

    async def on_cancel(self, msg: Message) -> None:
        run_id = msg.body["run_id"]
        run = await self.find_to_write(msg, Kind.FLOW_RUN, "run not cancelled", {"run_id": run_id, "status": "error"},
                                       {"run_id": run_id, "status": "unknown"})
        if run is None:
            return
        if not run.ended:
            if self.given_up(msg, "found its run"):
                return
            try:
                await self.cancel(run, msg.body.get("why") or "cancelled by request")
            except LogWriteError as exc:
                self.bus.reply(msg, Kind.FLOW_RUN, {"run_id": run.run_id, "status": "error",
                                                    **refused(exc, "run not cancelled")})
                return
        self.bus.reply(msg, Kind.FLOW_RUN, run.summary())

    async def time_out(self, run: Run) -> None:
        """Its time is up (`timeout_secs`; the watchdog asks): it ends cancelled, with its
        execution and its children (a refused end is tried again at the watchdog's next turn)."""
        run.timing_out = True
        try:
            await self.or_reload(run, self.cancel(run, f"timed out: not ended {run.timeout_secs:g} s after it began"))
        finally:
            run.timing_out = False

    async def cancel(self, run: Run, why: str) -> None:
        """End the run as cancelled and stop what runs for it: its execution and its children.
        LogWriteError if its end was refused; the run is then as it was."""
        # The child runs it waits on (they would run on, unheard of) are told first, in the same
        # loop iteration as the run's end is appended, not once that is durable: an actor that
        # died in between left them running. An end that did not become durable leaves the run
        # open, and a retried cancel tells them again. A child whose actor was down hears of it
        # when it comes back, one that missed it when it next asks (actors/run_links.py).
        self.stop_children(run, f"cancelled with its parent {run.run_id}")
        before = run.status, run.result, run.error, run.ended_at, run.waiting
        try:
            await self.end(run, "cancelled", error=why)
        except LogWriteError:
            run.status, run.result, run.error, run.ended_at, run.waiting = before
            raise
        task_id = f"{run.run_id}#{run.exec}"
        worker = self.run_workers.pop(run.run_id, "")
        if worker:  # stop its execution now rather than at its next step
            self.bus.send(worker, Kind.TASK_CANCEL, {"task_id": task_id})
        # and one this actor has not heard from yet: the scheduler drops the execution if it is
        # queued, or tells the worker it offered it to (else its step in flight ran to its end)
        self.bus.send(SCHEDULER, Kind.TASK_CANCEL, {"task_id": task_id})

    async def on_attr_get(self, msg: Message) -> None:
        run = await self.find(msg.body["run_id"], msg.body["tenant"], read=True)
        if run is None:
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": False, "code": "not_found", "error": "no such run"})
            return
        keys = msg.body.get("keys")
        values = run.attrs if not keys else {k: run.attrs[k] for k in keys if type(k) is str and k in run.attrs}
        self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "values": values})

    async def on_attr_update(self, msg: Message) -> None:
        run = await self.find_to_write(msg, Kind.ATTR_VALUES, "attribute not updated", {"found": True},
                                       {"found": False})
        if run is None:
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
        if self.given_up(msg, "got the run's lock"):
            return
        if run.ended:   # as a publish to it is: nothing reads or locks its attributes for it any more
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "code": "ended", "error": f"the run is {run.status}"})
            return
        task = self.submit_task("update", b["handler"], run.tenant,
                                {"key": key, "value": run.attrs.get(key), "arg": b.get("arg")}, run.run_id)
        try:
            value = await asyncio.wait_for(asyncio.shield(task), UPDATE_WAIT_SECS)
        except TaskFailed as exc:
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "code": "handler_failed", "error": str(exc)})
            return
        except asyncio.TimeoutError:
            # The run's other updates wait behind this one: give the lock up rather than hold it
            # for a handler no worker runs (all of them busy, or stopped).
            self.cancel_task(self.task_id_of(task))
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "code": "unavailable", "error":
                           f"no worker ran update handler {b['handler']!r} within {UPDATE_WAIT_SECS:g}s"})
            return
        if self.given_up(msg, "had its handler's value"):   # the value is dropped
            return
        had, old = key in run.attrs, run.attrs.get(key)
        try:
            await self.record(run, "attr.set", key=key, value=value, seq=-1)
        except LogWriteError as exc:
            if run.attrs.get(key) is value:   # not set again since
                if had:
                    run.attrs[key] = old
                else:
                    del run.attrs[key]
            self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, **refused(exc, "attribute not updated")})
            return
        self.bus.reply(msg, Kind.ATTR_VALUES, {"found": True, "values": {key: value}})


async def _until(run: Run, until: str | None, secs: float) -> None:
    """Wait up to `secs` for the run's end, or for what `until` names (its suspension, an emitted
    value; actors/worker_requests.py `_wake` answers)."""
    waiter = asyncio.get_running_loop().create_future()
    run.waiters.append((until, waiter))
    try:
        await asyncio.wait_for(asyncio.shield(waiter), secs)
    except asyncio.TimeoutError:
        pass
    finally:
        run.waiters = [w for w in run.waiters if w[1] is not waiter]
