"""Tool calls a person approves before they run, as opencode's "ask" permission or LangGraph's
interrupt before a tool.

A turn whose model calls a tool named in `kernel.approve_tools` ("*": any) stops before running
it: its stream carries a `tool` event of phase `approval` (the call's id, name and arguments,
and `until`, when it gives up waiting), and the turn waits, holding no provider permit, until
`POST /v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}` says `{"approve": true}`, or
`false` with a `reason`, or `kernel.approval_timeout_secs` pass. A call not approved is not run:
the model reads that it was not, and why, and goes on.

The wait is an operation of the turn's run: journaled (a `wait` on channel `approval:<call id>`,
due when it gives up) before its event goes out, and the answer (`op.done`) journaled before the
approver hears it. An actor that dies meanwhile is succeeded by one that finishes the turn and
waits again for what is left of the time (its session's `active_turn` lists what waits, for a
client that has no stream); an answer given is never asked again. The session's event history
(`GET /v1/sessions/{sid}/events`) keeps both: `tool.approval` when a call begins to wait and
`tool.approval_answered` (`approve`, `reason`) when it is answered or its time runs out.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from actors.flow_state import Run
from actors.provider import ToolCall
from broker.protocol import Kind
from storage.log_client import LogWriteError

if TYPE_CHECKING:
    from actors.flow_runs import Flows
    from actors.persistence import Persistence
    from actors.turn import Turn

CHANNEL_PREFIX = "approval:"


class Pending:
    """A call waiting for its answer: where its wait is in the run, and what its event said."""

    __slots__ = ("seq", "view", "answered", "deciding")

    def __init__(self, seq: int, view: dict[str, Any]) -> None:
        self.seq = seq
        self.view = view
        self.answered = asyncio.get_running_loop().create_future()
        self.deciding = False   # an answer is being journaled: the timeout leaves it to that


def _outcome(run: Run, seq: int) -> tuple[bool, str]:
    op = run.ops[seq]
    if not op.ok:
        return False, "nobody approved it in time"
    answer = op.result or {}
    return bool(answer.get("approve")), str(answer.get("reason") or ("" if answer.get("approve") else "denied"))


class ToolApprovals:
    def __init__(self, flows: "Flows", names: str, timeout_secs: float,
                 persistence: "Persistence | None" = None) -> None:
        self.flows = flows
        self.persistence = persistence   # the event history (None in unit tests that have none)
        self.names = {n.strip() for n in names.split(",") if n.strip()}
        self.timeout_secs = timeout_secs

    def needed(self, tool: str) -> bool:
        return "*" in self.names or tool in self.names

    async def ask(self, turn: "Turn", run: Run, seq: int, call: ToolCall) -> tuple[bool, str]:
        """Whether the call may run, and why not: asked at operation `seq` of the turn's run (the
        agent loop places it there when `needed` said so). A replayed turn follows its journal:
        an answer recorded is not asked again, a wait recorded is waited again."""
        op = run.ops.get(seq)
        if op is None:
            await self.flows.record(run, "wait", seq=seq, name=f"approval:{call.name}",
                                    channel=CHANNEL_PREFIX + call.id, due=time.time() + self.timeout_secs)
            op = run.ops[seq]
            self._event(turn, "tool.approval", {"call_id": call.id, "name": call.name, "arguments": call.arguments,
                                                "until": op.due})
        if op.done:
            return _outcome(run, seq)
        pending = Pending(seq, {"call_id": call.id, "name": call.name, "arguments": call.arguments, "until": op.due})
        turn.approvals[call.id] = pending
        turn.emit(Kind.TURN_TOOL, {"phase": "approval", "name": call.name, "data": {
            "call_id": call.id, "arguments": call.arguments, "until": op.due}})
        try:
            await asyncio.wait_for(asyncio.shield(pending.answered), max(0.0, op.due - time.time()))
        except asyncio.TimeoutError:
            while pending.deciding:   # an answer came at the last moment: it is being journaled
                await asyncio.sleep(0.05)
            turn.approvals.pop(call.id, None)   # (no answer is taken from here on)
            if not op.done:
                await self.flows.record(run, "op.done", seq=seq, op="wait", ok=False, error="timeout")
                self._answered(turn, pending, False, "nobody approved it in time")
        finally:
            turn.approvals.pop(call.id, None)
        return _outcome(run, seq)

    async def answer(self, turn: "Turn", run: Run, call_id: str, approve: bool, reason: str) -> str | None:
        """A person's answer for a waiting call, journaled before it is acted on; an error code
        if it cannot be taken (`not_waiting`: no call of this turn waits under that id)."""
        pending = turn.approvals.get(call_id)
        if pending is None or pending.deciding:
            return "not_waiting"
        pending.deciding = True
        op = run.ops[pending.seq]
        try:
            await self.flows.record(run, "op.done", seq=pending.seq, op="wait", ok=True,
                                    result={"approve": approve, "reason": reason})
        except LogWriteError as exc:   # memory went ahead of the journal: back to waiting
            run.reopen(op)
            pending.deciding = False
            return exc.code
        self._answered(turn, pending, approve, reason)
        if not pending.answered.done():
            pending.answered.set_result(None)
        return None

    def _answered(self, turn: "Turn", pending: Pending, approve: bool, reason: str) -> None:
        self._event(turn, "tool.approval_answered", {"call_id": pending.view["call_id"],
                                                     "name": pending.view["name"], "approve": approve,
                                                     "reason": reason})

    def _event(self, turn: "Turn", kind: str, data: dict[str, Any]) -> None:
        if self.persistence is not None:
            self.persistence.event_nowait(turn, kind, data)
