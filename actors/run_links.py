"""A parent run and its children: what keeps the link whole when a word between them is lost.

Each end tells the other once: a parent's cancel or failure goes to its open children
(`stop_children`), a child's end goes to its parent (`WorkerRequests._notify_parent`), and a child
is started by its parent once the `child.started` record is durable. Any of these words is lost if
the process that was to send it dies right after the record it follows, or if the receiving actor
stays down past the request's timeout. Lost, they left a parent parked on a child forever (the
child's end unheard, or the child never started: a parked run is not dispatched again) and an
ended parent's child running on.

So each end also asks after the other: when its actor loads it after a restart, and every
`LINK_CHECK_SECS` while it lives. A child asks whether its parent has ended (`follow_parent`: it
is then cancelled, since nobody is left to take its result); a parent parked on a child asks for
the child's status (`follow_child`). Asking is idempotent, so a word that was not lost costs one
answered question.

A mixin of `actors.flow_runs.Flows` (it uses `record`'s state, `cancel`, `dispatch`, `or_reload`
and `_child_ended`).
"""
from __future__ import annotations

import asyncio

from actors.flow_state import TERMINAL, Op, Run
from broker.client import BusError
from broker.protocol import Kind
from broker.sharding import actor_name
from storage.log_client import LogWriteError

LINK_CHECK_SECS = 30.0   # how often a live run asks after the other end of its parent-child link
ASK_TIMEOUT_SECS = 30.0


class RunLinks:
    def open_children(self, run: Run) -> list[Op]:
        """The children a run parked on children waits for: those a flow started at once
        (asyncio.gather) are all open together, the first of them what `blocked_on` names (every
        op before that one is over)."""
        return [run.ops[seq] for seq in sorted(run.open_children)] if self.waits_on_children(run) else []

    def waits_on_children(self, run: Run) -> bool:
        if not run.open_children:
            return False
        op = self.blocked_on(run)
        return op is not None and op.op == "child"

    def check_links(self, run: Run, now: float) -> None:
        """The watchdog's turn for an open run: ask after its parent and its child, if it is time."""
        if now - run.link_checked < LINK_CHECK_SECS or run.stale:
            return
        run.link_checked = now
        if run.parent:
            self.bus.spawn(self.follow_parent(run, attempts=1))
        for op in self.open_children(run):
            if op.child:
                self.bus.spawn(self.follow_child(run, op, periodic=True))

    async def follow_parent(self, run: Run, attempts: int = 4) -> None:
        """The run is cancelled if its parent was: the parent's word of it may have been lost."""
        error: Exception | None = None
        for attempt in range(attempts):
            try:
                reply = await self.bus.request(run.parent_actor or actor_name(run.parent, self.shards), Kind.FLOW_GET,
                                               {"run_id": run.parent, "tenant": run.tenant},
                                               timeout=ASK_TIMEOUT_SECS, session=run.parent)
                break
            except BusError as exc:
                error = exc
                if attempt + 1 < attempts:
                    await asyncio.sleep(2 ** attempt)
        else:   # a periodic question (one attempt) is asked again: no line for each of many children
            (self.log.warning if attempts > 1 else self.log.debug)(
                "could not ask parent %s whether child %s is to run on: %s", run.parent, run.run_id, error)
            return
        status = reply.body.get("status")
        if status in TERMINAL and not run.ended and not run.stale:   # nobody is left to take its result
            why = f"cancelled with its parent {run.parent}" if status == "cancelled" else \
                f"its parent {run.parent} {status}"
            try:
                await self.cancel(run, why)
            except LogWriteError as exc:
                self.log.warning("child %s of ended run %s not cancelled: %s", run.run_id, run.parent, exc)

    async def follow_child(self, run: Run, op: Op, periodic: bool = False) -> None:
        """A child the run is parked on, asked after: its end is recorded if it has ended, and
        the run executes again if the child never began (its replay asks for the child again,
        with the input only the flow's code has, and that starts it)."""
        try:
            reply = await self.bus.request(actor_name(op.child, self.shards), Kind.FLOW_GET,
                                           {"run_id": op.child, "tenant": run.tenant},
                                           timeout=ASK_TIMEOUT_SECS, session=op.child)
        except BusError as exc:   # asked again at the next check
            (self.log.debug if periodic else self.log.warning)("could not ask child %s of %s how it stands: %s",
                                                                op.child, run.run_id, exc)
            return
        if run.ended or run.stale or op.done or self.runs.get(run.run_id) is not run:
            return   # the child's word came meanwhile, or the run moved on
        status = reply.body.get("status")
        if status in TERMINAL:
            self.log.info("child %s of %s had ended unheard (%s): recorded now", op.child, run.run_id, status)
            await self.or_reload(run, self._child_ended(run, op.seq, status == "completed", reply.body.get("result"),
                                                        reply.body.get("error", f"child flow {status}")))
        elif reply.body.get("code") == "not_found" and op.seq in run.open_children and self.waits_on_children(run):
            self.log.info("child %s of %s never began: running the parent again to start it", op.child, run.run_id)
            self.dispatch(run)

    def stop_children(self, run: Run, why: str) -> None:
        """Cancel the children the run waits on: it is ending, and their results would go nowhere."""
        for op in run.ops.values():
            if op.op == "child" and op.child and not op.done:
                self.bus.spawn(self.cancel_child(run, op.child, why))

    async def cancel_child(self, run: Run, child: str, why: str) -> None:
        try:
            await self.bus.request(actor_name(child, self.shards), Kind.FLOW_CANCEL,
                                   {"run_id": child, "tenant": run.tenant, "why": why},
                                   timeout=ASK_TIMEOUT_SECS, session=child)
        except BusError as exc:
            self.log.warning("could not cancel child %s of ended run %s: %s", child, run.run_id, exc)
