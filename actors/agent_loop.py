"""The agent loop of a turn, on durable steps.

A turn is a run of the built-in flow `turn` owned by its session's actor (run id
`SESSION/TURN`). Each model call is a step: it holds a provider permit from the scheduler for as
long as its stream is open, and its whole answer (text, tool calls, usage) is journaled. Each
tool call the model asks for is a step run by a worker that registered the tool; its result is
journaled and handed back to the model. The calls of one answer run at once (up to
`kernel.tool_calls_at_once`), each at a place in the run fixed with the answer. The loop ends
when the model answers without tool calls, or after `kernel.max_steps_per_turn` model calls.
After every step the session is checkpointed. If the actor dies mid-turn, its successor replays
the journal — finished steps return their recorded outcome, nothing runs twice — and finishes
the turn in the background.

A provider 429 releases the permit with the provider's Retry-After, so the scheduler pauses
every grant, not just this one. A model call that failed before any token was streamed is
retried (up to `provider.max_retries`); one that failed mid-stream is not, since the client has
already seen part of its answer.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson

from agentos import metrics
from actors.context_window import answered, context
from actors.flow_runs import Flows
from actors.run_requests import TaskFailed
from actors.flow_state import Run
from actors.permit_client import PermitClient
from actors.persistence import Persistence
from actors.provider import ModelResult, Provider, ProviderError, ToolCall
from actors.session import Session
from actors.tool_approvals import ToolApprovals
from actors.turn import Turn
from broker.client import Bus, BusError
from broker.protocol import Kind

TURN_FLOW = "turn"
TOOLS_CACHE_SECS = 2.0
TOOL_TIMEOUT_SECS = 120.0


def turn_run_id(session_id: str, turn_id: str) -> str:
    return f"{session_id}/{turn_id}"


def run_owner_key(run_id: str) -> str:
    """What a run is sharded by: the session for a turn, the run id itself for a flow."""
    return run_id.split("/", 1)[0]


class AgentLoop:
    def __init__(self, provider: Provider, permits: PermitClient, persistence: Persistence, flows: Flows,
                 bus: Bus, max_retries: int, max_steps: int, approvals: ToolApprovals | None = None,
                 tool_calls_at_once: int = 8) -> None:
        self.provider = provider
        self.tool_calls_at_once = tool_calls_at_once
        self.approvals = approvals or ToolApprovals(flows, "", 0.0)
        self.permits = permits
        self.persistence = persistence
        self.flows = flows
        self.bus = bus
        self.max_retries = max_retries
        self.max_steps = max_steps
        self._tools: list[dict] = []
        self._tools_at = 0.0

    async def tool_schemas(self) -> list[dict]:
        """Tools advertised by live workers (asked of the scheduler, cached for a moment)."""
        if time.monotonic() - self._tools_at > TOOLS_CACHE_SECS:
            self._tools_at = time.monotonic()
            try:
                reply = await self.bus.request("scheduler", Kind.TOOLS_LIST, {}, timeout=2.0)
                self._tools = reply.body["tools"]
            except BusError:
                pass  # keep the last list: the scheduler may be restarting
        return self._tools

    async def model_call(self, turn: Turn, messages: list[dict], tools: list[dict]) -> ModelResult:
        retries = 0
        while True:
            permit = await self.permits.acquire(turn.tenant, turn.session_id, turn.turn_id)
            backoff = 0.0
            first_token = turn.first_token_at
            try:
                return await self.provider.call(messages, turn.delta, tools or None)
            except ProviderError as exc:
                streamed = turn.first_token_at != first_token
                metrics.inc(metrics.provider_errors.labels(exc.kind))
                if exc.kind == "rate_limited":
                    backoff = exc.retry_after
                if streamed or not exc.retryable or retries >= self.max_retries:
                    raise
                retries += 1
            finally:
                self.permits.release(permit, backoff, turn.session_id, turn.turn_id)
            if not backoff:
                await asyncio.sleep(min(0.1 * 2 ** retries, 2.0))

    async def run(self, turn: Turn, session: Session, journal: Run | None = None) -> dict:
        """Run (or, with the journal of an interrupted turn, finish) the turn; returns the data of
        its `turn.completed` event. The last step's events travel in the batch of the last SYNC
        checkpoint, so once it is acknowledged they are durable too."""
        await self.persistence.ensure_loaded(session)
        run = journal
        if run is None:
            run = Run(turn_run_id(session.id, turn.turn_id), TURN_FLOW, turn.tenant)
            self.flows.runs[run.run_id] = run
            self.flows.record(run, "run.started", sync=False, flow=TURN_FLOW,
                              input={"session": session.id, "input": turn.input, "turn": turn.turn_id,
                                     "user_index": len(session.messages),
                                     **({"system": turn.system} if turn.system is not None else {})})
            session.messages.append({"role": "user", "content": turn.input})
        tools = await self.tool_schemas()
        seq = 0
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        finish = ""
        for _ in range(self.max_steps):
            result, places, seq = await self._model_step(turn, session, run, seq, tools)
            usage["prompt_tokens"] += result.prompt_tokens
            usage["completion_tokens"] += result.completion_tokens
            finish = result.finish_reason
            if not result.tool_calls:
                break
            seq = await self._tool_round(turn, session, run, seq, result.tool_calls, places)
            await self.persistence.checkpoint(session, turn)
        else:
            finish = "max_steps"
        now = time.monotonic()
        ttft_ms = (turn.first_token_at - turn.started_at) * 1000.0 if turn.first_token_at else None
        durations = {"ttft_ms": None if ttft_ms is None else round(ttft_ms, 3),
                     "total_ms": round((now - turn.started_at) * 1000.0, 3)}
        self.persistence.event_nowait(turn, "turn.completed", {"outcome": "completed", "usage": usage,
                                                              "durations": durations, "steps": seq})
        # The run's end rides in the batch of the last checkpoint (same writer: the session's), so
        # a turn whose end the client saw is never resumed after a crash and completed twice.
        self.flows.record(run, "run.ended", sync=False, status="completed", result={"steps": seq})
        await self.persistence.checkpoint(session, turn)
        metrics.inc(metrics.tokens_prompt, usage["prompt_tokens"])
        metrics.inc(metrics.tokens_completion, usage["completion_tokens"])
        if ttft_ms is not None:
            metrics.observe(metrics.turn_ttft, ttft_ms)
        return {"turn_id": turn.turn_id, "session_id": session.id, "usage": usage, "durations": durations,
                "finish_reason": finish, "steps": seq}

    async def _model_step(self, turn: Turn, session: Session, run: Run, seq: int,
                          tools: list[dict]) -> tuple[ModelResult, list | None, int]:
        """The model's answer (recorded, or asked for now), where in the run each of its tool
        calls has its operations (None: a journal of code before those places were recorded),
        and the seq after the answer."""
        op = run.ops.get(seq)
        if op is not None and op.done:
            result = _model_result(op.result)
            places = op.result.get("places")
        else:
            started = time.monotonic()
            self.flows.record(run, "step.started", sync=False, seq=seq, name="model", attempt=1)
            sent = answered(context(session.messages, self.provider.config.max_context_chars))
            system = self.provider.config.system_prompt if turn.system is None else turn.system
            result = await self.model_call(turn, [{"role": "system", "content": system}, *sent] if system else sent,
                                           tools)
            places = self._places(seq + 1, result.tool_calls)
            answer = {"text": result.text, "finish_reason": result.finish_reason,
                      "usage": [result.prompt_tokens, result.completion_tokens],
                      "tool_calls": [[c.id, c.name, c.arguments] for c in result.tool_calls],
                      **({"places": places} if places else {})}
            # The answer is durable before its tools run; a final answer rides with the last checkpoint.
            ack = self.flows.record(run, "step.done", sync=bool(result.tool_calls), seq=seq, name="model", ok=True,
                                    result=answer, attempt=1)
            self.persistence.event_nowait(turn, "step.completed", {
                "step": seq, "kind": "model", "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens, "messages_sent": len(sent),
                "duration_ms": round((time.monotonic() - started) * 1000.0, 3)})
            if ack is not None:
                await ack
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in result.tool_calls]
        add_message(turn, session, message)
        return result, places, seq + 1

    def _places(self, seq: int, calls: list[ToolCall]) -> list[list[int]]:
        """Each call's operations from `seq` on: its wait for approval (-1: none) and its step.
        Fixed, and journaled with the answer, before any call runs: the calls finish in any
        order, and a replay finds each where it was whatever the approval policy is by then."""
        places = []
        for call in calls:
            asks = self.approvals.needed(call.name)
            places.append([seq, seq + 1] if asks else [-1, seq])
            seq += 2 if asks else 1
        return places

    async def _tool_round(self, turn: Turn, session: Session, run: Run, seq: int, calls: list[ToolCall],
                          places: list | None) -> int:
        """Run one answer's tool calls, `tool_calls_at_once` of them at once, and add their
        results to the history in the calls' order; returns the seq after them. A call the round
        did not finish (the turn was cancelled, or failed) is answered all the same, with why: a
        provider refuses a history with a tool call left unanswered, so the session's next turn
        would fail too."""
        outcomes: dict[int, tuple[bool, Any]] = {}
        tasks: list[asyncio.Future] = []
        why = ""
        try:
            if places is None:   # a turn begun by code before places were journaled: one by one, as it did
                for i, call in enumerate(calls):
                    op = run.ops.get(seq)
                    asks = op.op == "wait" if op is not None else self.approvals.needed(call.name)
                    place = [seq, seq + 1] if asks else [-1, seq]
                    ok, output, ran = await self._tool_call(turn, run, call, place)
                    outcomes[i] = ok, output
                    seq = place[1] + 1 if ran else place[0] + 1   # (a call not approved had no step)
            else:
                seq = max(step for _, step in places) + 1
                limit = asyncio.Semaphore(self.tool_calls_at_once)

                async def one(i: int, call: ToolCall, place: list[int]) -> None:
                    ok, output, _ = await self._tool_call(turn, run, call, place, limit)
                    outcomes[i] = ok, output

                tasks = [asyncio.ensure_future(one(i, call, place))
                         for i, (call, place) in enumerate(zip(calls, places))]
                await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            why = f"the turn was cancelled ({turn.cancel_reason or 'cancelled'})"
            raise
        except BaseException:
            why = "the turn failed"
            raise
        finally:
            for task in tasks:   # one failed: the others stop (their tools too)
                task.cancel()
            for i, call in enumerate(calls):   # (no await before this: a superseding turn's message comes after)
                ok, output = outcomes.get(i, (False, f"not finished: {why} before this call's result came"))
                add_message(turn, session, {"role": "tool", "tool_call_id": call.id,
                                            "content": orjson.dumps(output if ok else {"error": str(output)}).decode()})
        return seq

    async def _tool_call(self, turn: Turn, run: Run, call: ToolCall, place: list[int],
                         limit: asyncio.Semaphore | None = None) -> tuple[bool, Any, bool]:
        """One tool call at its place: asked for approval there if it has a wait, then run as a
        step (a recorded outcome is not run again). Its outcome, and whether it had a step (a
        call not approved has none)."""
        wait_seq, seq = place
        turn.emit(Kind.TURN_TOOL, {"phase": "call", "name": call.name, "data": {"call_id": call.id,
                                                                               "arguments": call.arguments}})
        approval = await self.approvals.ask(turn, run, wait_seq, call) if wait_seq >= 0 else (True, "")
        op = run.ops.get(seq)
        if not approval[0]:   # not run: the model reads why
            ok, output = False, f"the user did not approve this call of {call.name}: {approval[1]}"
        elif op is not None and op.done:
            ok, output = op.ok, (op.result if op.ok else op.error)
        else:
            async with limit or contextlib.nullcontext():
                op = run.ops.get(seq)
                attempt = (op.attempts if op is not None else 0) + 1
                await self.flows.record(run, "step.started", seq=seq, name=f"tool:{call.name}", attempt=attempt)
                ok, output = await self._run_tool(turn, run, call)
                fields = {"result": output} if ok else {"error": str(output)}
                await self.flows.record(run, "step.done", seq=seq, name=f"tool:{call.name}", ok=ok, attempt=attempt,
                                        **fields)
        turn.emit(Kind.TURN_TOOL, {"phase": "result", "name": call.name, "data": {
            "call_id": call.id, "ok": ok, **({"result": output} if ok else {"error": str(output)})}})
        return ok, output, approval[0]

    async def _run_tool(self, turn: Turn, run: Run, call: ToolCall) -> tuple[bool, Any]:
        try:
            arguments = orjson.loads(call.arguments) if call.arguments else {}
        except orjson.JSONDecodeError:
            return False, f"the arguments of {call.name} are not valid JSON: {call.arguments[:200]!r}"
        future = self.flows.submit_task("tool", call.name, turn.tenant, {"arguments": arguments}, run.run_id)
        task_id = self.flows.task_id_of(future)
        try:
            result = await asyncio.wait_for(asyncio.shield(future), TOOL_TIMEOUT_SECS)
        except TaskFailed as exc:
            return False, str(exc)
        except asyncio.TimeoutError:
            self.flows.cancel_task(task_id)
            return False, f"no worker ran tool {call.name!r} within {TOOL_TIMEOUT_SECS:g}s"
        except asyncio.CancelledError:
            self.flows.cancel_task(task_id)  # the turn was cancelled: its tool stops too
            raise
        try:   # the model reads it as JSON, and so does the turn's stream
            orjson.dumps(result)
        except TypeError as exc:   # bytes, say: msgpack carried it here, JSON cannot
            return False, f"the result of tool {call.name!r} is not JSON: {exc}"
        return True, result


def _model_result(answer: dict) -> ModelResult:
    return ModelResult(text=answer.get("text", ""), finish_reason=answer.get("finish_reason", ""),
                       prompt_tokens=answer.get("usage", [0, 0])[0], completion_tokens=answer.get("usage", [0, 0])[1],
                       tool_calls=[ToolCall(i, n, a) for i, n, a in answer.get("tool_calls", [])])


def add_message(turn: Turn, session: Session, message: dict) -> None:
    """Append a message, unless a resumed turn is replaying one its checkpoint brought back."""
    pos = turn.replay_pos
    if pos is not None and pos < len(session.messages):
        if session.messages[pos] == message:
            turn.replay_pos = pos + 1
            return
        del session.messages[pos:]  # the checkpoint went further than the journal: the journal wins
    turn.replay_pos = None
    session.messages.append(message)
