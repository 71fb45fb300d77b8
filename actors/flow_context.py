"""What a flow's code sees while it runs: `FlowContext` (`ctx`), made by the worker for each
execution of a run (actors/worker_process.py); what its operations raise: actors/flow_types.py.
actors/sdk.py re-exports both.

Each operation asks the run's actor (STEP_START) before it goes, and takes its seq in the run's
journal when it is called: a replay finds the recorded outcome there. Operations of one
execution may run at once (asyncio.gather); `_in_turn` orders what must not overlap.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from typing import Any, Awaitable, Callable, Iterable


from actors.flow_queues import MAX_KEY, MAX_PRIORITY, valid_priority, valid_queue_key
from actors.flow_state import MAX_WAIT_CHANNELS
from broker.protocol import MAX_WHERE
from agentos.tenant_ids import DEFAULT_TENANT, external
from actors.flow_types import (ChildFailed, NonDeterministic, Retry, SendFailed, StepContext, StepFailed, Superseded,
                               Suspended, WaitTimeout, check_encodable)


def _seconds(value: Any, what: str) -> float:
    """A duration a run waits: a finite number, negatives taken as 0."""
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{what} takes a finite number of seconds, got {value!r}")
    return max(0.0, seconds)


def _timeout(value: Any, what: str) -> dict[str, float]:
    """A wait's timeout, and when it is due: counted from the call, as a sleep's is, so two waits
    at once (asyncio.gather; the second's turn comes when the first is over) time out together."""
    if value is None:
        return {}
    seconds = _seconds(value, what)
    return {"timeout": seconds, "due": time.time() + seconds}


def _queue_key(value: Any) -> str:
    if not valid_queue_key(value):
        raise ValueError(f"a queue_key is a string of 1 to {MAX_KEY} characters, got {value!r}")
    return value


def _priority(value: Any) -> int:
    if not valid_priority(value):
        raise ValueError(f"a priority is a whole number, 0 to {MAX_PRIORITY:,}, got {value!r}")
    return value


# what an operation of each kind waits for, of those called before it (FlowContext._in_turn)
_WAITS_FOR = {"park": ("step", "park", "child"), "child": ("step", "park"), "step": ("park", "child")}


class FlowContext:
    """What a flow's code sees. Made by the worker for each execution of a run."""

    def __init__(self, runtime: Any, run_id: str, exec_: int, input_: Any, journal: list[dict],
                 attrs: dict[str, Any], tenant: str | None = None) -> None:
        self._rt = runtime
        self._id = run_id                        # inside the server (a tenant's: `acme~order-1`)
        self.run_id = external(tenant or DEFAULT_TENANT, run_id)   # as its client names it (ctx.send takes it)
        self.input = input_
        self._exec = exec_
        self._journal = journal
        self._seq = 0
        self._attrs = dict(attrs)
        self._results_due: set[int] = set()   # ASYNC results sent and not yet answered (the runtime's)
        # operations sent and not yet over, by seq: their kind ("park": a sleep or wait, "child",
        # over once answered; "step": once its outcome is sent) and a future done then, made once
        # another operation waits for it
        self._open: dict[str, dict[int, asyncio.Future | None]] = {"step": {}, "park": {}, "child": {}}
        self._ending = False   # an operation was answered `suspend` or `abort`: this execution ends

    @property
    def attrs(self) -> dict[str, Any]:
        """The run's attributes as of this execution (a copy: write with `set_attr`)."""
        return dict(self._attrs)

    def _past_patch_marks(self) -> None:
        """Pass over recorded patch marks whose `patched` call the code no longer makes (the
        old path is gone, the new one is the only one)."""
        while self._seq < len(self._journal) and self._journal[self._seq]["op"] == "patch":
            self._seq += 1

    def _take_seq(self, op: str) -> int:
        """The next operation's place: taken when it is called, so operations run at once
        (asyncio.gather) have their calls' order whatever order they finish in."""
        if op != "patch":
            self._past_patch_marks()
        self._seq += 1
        return self._seq - 1

    async def _in_turn(self, seq: int, kind: str) -> None:
        """Wait until operation `seq` may go. Steps run at once, and so do children; but a sleep
        or wait waits for every operation before it to be over, a child for the steps and sleeps
        before it, a step for the answer of each sleep, wait or child before it. So a run parks
        with no step in flight (its next execution would cut it off), on one sleep or wait or
        on children alone."""
        mine = self._open[kind]
        if seq in mine:   # a step's next attempt
            return
        # (all open ones came before it: each is open from when it was called)
        before = [self._done_of(self._open[o], at) for o in _WAITS_FOR[kind] for at in list(self._open[o])]
        mine[seq] = None   # (now: those after it see it; a future only once one waits for it)
        if not before and not self._ending:   # one operation after another, as most flows go
            return
        try:
            if before:
                await asyncio.wait(before)   # (not gather: a cancel here must not cancel the others')
            if self._ending:
                raise Suspended   # the execution ends: what is after its park runs in the next one
        except BaseException:
            self._over(seq)
            raise

    @staticmethod
    def _done_of(open_: dict[int, asyncio.Future | None], seq: int) -> asyncio.Future:
        done = open_[seq]
        if done is None:
            done = open_[seq] = asyncio.get_running_loop().create_future()
        return done

    def _over(self, seq: int) -> None:
        for open_ in self._open.values():
            if seq in open_:
                done = open_.pop(seq)
                if done is not None and not done.done():
                    done.set_result(None)
                return

    async def settled(self) -> None:
        """Wait for the operations still in flight (a step beside the one that parked runs on)."""
        while any(self._open.values()):
            await asyncio.wait([self._done_of(open_, at) for open_ in self._open.values() for at in list(open_)])

    async def _op(self, op: str, name: str, seq: int | None = None, **fields: Any) -> dict[str, Any]:
        if seq is None:
            seq = self._take_seq(op)
        if seq < len(self._journal):
            recorded = self._journal[seq]
            if recorded["op"] != op or recorded["name"] != name:
                raise NonDeterministic(
                    f"operation {seq} was {recorded['op']} {recorded['name']!r} when run {self.run_id} first ran, "
                    f"and the code now asks for {op} {name!r}: flow code must take the same path on replay")
            return {"action": "replay", **recorded}
        kind = "park" if op in ("sleep", "wait") else "child" if op == "child" else "step"
        await self._in_turn(seq, kind)
        try:
            body = await self._rt.step_start(self, {"seq": seq, "op": op, "name": name, **fields})
        except BaseException:
            self._over(seq)
            raise
        action = body["action"]
        if action in ("abort", "suspend"):
            self._ending = True
        if kind != "step" or action != "run":   # (a step that runs is over once its outcome is sent)
            self._over(seq)
        if action == "abort":
            raise Superseded
        if action == "suspend":
            raise Suspended
        if action == "fail" and "non-deterministic" in body.get("error", ""):
            raise NonDeterministic(body["error"])
        return {**body, "seq": seq}

    async def step(self, fn: Callable[..., Any], *args: Any, durability: str = "sync", retry: Retry | None = None,
                   timeout: float | None = None, name: str | None = None, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` as a durable step and return its (recorded) result.

        durability "sync": the attempt's start and its result are committed before the flow
        continues. "async": the flow continues at once and the commit follows (the flow's own end
        waits for it). `retry` bounds attempts across restarts; `timeout` bounds each attempt."""
        if durability not in ("sync", "async"):
            raise ValueError("durability must be 'sync' or 'async'")
        retry = retry or Retry()
        name = name or getattr(fn, "__name__", "step")
        if durability == "async":
            return await self._async_step(fn, args, kwargs, retry, timeout, name)
        seq = self._take_seq("step")
        try:
            return await self._sync_step(fn, args, kwargs, retry, timeout, name, seq)
        finally:
            self._over(seq)

    async def _sync_step(self, fn, args, kwargs, retry: Retry, timeout, name: str, seq: int) -> Any:
        while True:
            go = await self._op("step", name, seq=seq, sync=True, max_attempts=retry.max_attempts)
            if go["action"] in ("replay", "fail"):
                if go.get("ok", False):
                    return go.get("result")
                raise StepFailed(f"step {name!r} failed: {go.get('error', '')}")
            attempt = go["attempt"]
            try:
                result = await self._attempt(fn, args, kwargs, timeout, seq, attempt, go.get("heartbeat"))
                check_encodable(result, f"the result of step {name!r}")
            except (Suspended, Superseded):
                raise
            except asyncio.CancelledError:
                if getattr(self._rt, "stopping", False):   # not the step's doing: its next attempt is not its last
                    with contextlib.suppress(Exception):   # (not said: the attempt counts, as a crash's does)
                        await self._rt.step_result(self, seq, attempt, False, interrupted=True, name=name, sync=True)
                raise
            except Exception as exc:  # the step's own failure: journaled, then retried or raised
                final = attempt >= retry.max_attempts
                await self._rt.step_result(self, seq, attempt, False, error=f"{type(exc).__name__}: {exc}",
                                           final=final, name=name, sync=True)
                if final:
                    raise StepFailed(f"step {name!r} failed after {attempt} attempts: {type(exc).__name__}: {exc}")\
                        from exc
                await asyncio.sleep(retry.delay(attempt))
                continue
            await self._rt.step_result(self, seq, attempt, True, result=result, name=name, sync=True)
            return result

    async def _async_step(self, fn, args, kwargs, retry: Retry, timeout, name: str) -> Any:
        seq = self._take_seq("step")
        if seq < len(self._journal):
            go = await self._op("step", name, seq=seq)
            if go.get("ok", False):
                return go.get("result")
            raise StepFailed(f"step {name!r} failed: {go.get('error', '')}")
        await self._in_turn(seq, "step")
        try:
            return await self._async_attempts(fn, args, kwargs, retry, timeout, name, seq)
        finally:
            self._over(seq)

    async def _async_attempts(self, fn, args, kwargs, retry: Retry, timeout, name: str, seq: int) -> Any:
        for attempt in range(1, retry.max_attempts + 1):
            try:
                result = await self._attempt(fn, args, kwargs, timeout, seq, attempt, None)
                check_encodable(result, f"the result of step {name!r}")
            except (Suspended, Superseded):
                raise
            except Exception as exc:
                if attempt >= retry.max_attempts:
                    self._rt.step_result_nowait(self, seq, attempt, False, error=f"{type(exc).__name__}: {exc}",
                                                name=name)
                    raise StepFailed(f"step {name!r} failed after {attempt} attempts: {exc}") from exc
                await asyncio.sleep(retry.delay(attempt))
                continue
            self._rt.step_result_nowait(self, seq, attempt, True, result=result, name=name)
            return result

    async def _attempt(self, fn, args, kwargs, timeout, seq: int, attempt: int, heartbeat: Any) -> Any:
        if "step" in _parameters(fn):
            kwargs = {**kwargs, "step": StepContext(attempt, heartbeat,
                                                    lambda v: self._rt.heartbeat(self, seq, attempt, v))}
        if inspect.iscoroutinefunction(fn):
            call: Awaitable = fn(*args, **kwargs)
        else:
            threads = getattr(self._rt, "threads", None)   # the worker's, one per slot (actors/worker_process.py)
            call = (threads.call(lambda: fn(*args, **kwargs)) if threads is not None
                    else asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs)))
        return await (asyncio.wait_for(call, timeout) if timeout else call)

    async def sleep(self, seconds: float) -> None:
        """A durable sleep: the run holds no worker meanwhile, and it survives restarts."""
        await self._op("sleep", "sleep", due=time.time() + _seconds(seconds, "ctx.sleep"))

    async def wait(self, channel: str, timeout: float | None = None) -> Any:
        """The next message published to this run's `channel` (FIFO; one message per wait)."""
        # timeout=0: take a message already there, or time out now
        go = await self._op("wait", channel, channel=channel, **_timeout(timeout, "ctx.wait's timeout"))
        if go.get("ok", True):
            return go.get("result")
        raise WaitTimeout(f"no message on channel {channel!r} within {timeout}s")

    async def wait_any(self, channels: Iterable[str], timeout: float | None = None) -> tuple[str, Any]:
        """The next message published to any of `channels`, and the channel it came on: `(channel,
        message)`. Of messages already waiting, the one published first. For a person's answer that
        comes as one of several kinds (`approve` or `reject`), as Restate's select or Temporal's
        selector; with `timeout`, WaitTimeout when none came."""
        if isinstance(channels, str):
            raise TypeError("ctx.wait_any takes a list of channels (for one, ctx.wait)")
        names = list(channels)
        if not 0 < len(names) <= MAX_WAIT_CHANNELS or len(set(names)) != len(names) or \
                not all(isinstance(c, str) and c for c in names):
            raise ValueError(f"ctx.wait_any takes 1 to {MAX_WAIT_CHANNELS} channels, each a non-empty string "
                             f"named once, got {names!r}")
        go = await self._op("wait", "|".join(names), channel=names[0], channels=names,
                            **_timeout(timeout, "ctx.wait_any's timeout"))
        if go.get("ok", True):
            channel, message = go.get("result")
            return channel, message
        raise WaitTimeout(f"no message on channels {names!r} within {timeout}s")

    async def send(self, run_id: str, channel: str, message: Any = None) -> None:
        """Publish `message` to `channel` of another run of this tenant (or of this one), taken
        there once whatever restarts come between (as DBOS's send or a Temporal signal): the
        target takes one message per sending run and place. SendFailed if there is no such run
        or it has ended."""
        if not isinstance(run_id, str) or not run_id or not isinstance(channel, str) or not channel:
            raise ValueError("ctx.send takes a run id and a channel name, each a non-empty string")
        check_encodable(message, "a sent message")
        go = await self._op("send", f"{channel}@{run_id}", target=run_id, channel=channel, message=message)
        if not go.get("ok", True):
            raise SendFailed(f"message to run {run_id!r} on {channel!r} not sent: {go.get('error', '')}")

    async def publish(self, channel: str, message: Any = None, flow: str | None = None,
                      where: dict[str, Any] | None = None) -> int:
        """Publish `message` to every run of this tenant waiting on `channel` now (of `flow`, with
        the attribute values `where` names), as `POST /v1/channels/{name}` does; how many took it.
        A replay after a crash publishes again, and a run that took it does not take it twice
        (the count is then of the runs that took it from the publish the journal kept)."""
        if not isinstance(channel, str) or not channel:
            raise ValueError("ctx.publish takes a channel name, a non-empty string")
        if flow is not None and (not isinstance(flow, str) or not flow):
            raise ValueError("ctx.publish's flow is a flow's name, a non-empty string")
        if where is not None and not (isinstance(where, dict) and 0 < len(where) <= MAX_WHERE
                                      and all(isinstance(k, str) for k in where)):
            raise ValueError(f"ctx.publish's where maps 1 to {MAX_WHERE} attribute names to the values a run's "
                             "must have")
        check_encodable(message, "a published message")
        check_encodable(where, "a publish's where")
        go = await self._op("publish", channel, channel=channel, message=message,
                            **({"flow": flow} if flow else {}), **({"where": where} if where else {}))
        return go.get("result", 0)

    async def child(self, flow: str | Callable[..., Any], input: Any = None, run_id: str | None = None,
                    queue: str | None = None, priority: int = 0, queue_key: str | None = None) -> Any:
        """Start a child flow — its name, or the flow function itself — and wait for its result;
        with `queue` (one of the server's `kernel.flow_queues`), it waits there for a place, before
        the runs of a higher `priority` number, and in a queue per key, its `queue_key`'s."""
        if callable(flow):                # the name this worker's app registered it under
            flows = getattr(getattr(self._rt, "app", None), "flows", {})
            flow = next((name for name, fn in flows.items() if fn is flow), flow.__name__)
        if not isinstance(flow, str):
            raise TypeError(f"ctx.child takes a flow (its function or its name), not {type(flow).__name__}")
        check_encodable(input, "a child flow's input")
        go = await self._op("child", flow, input=input, **({"child": run_id} if run_id else {}),
                            **({"queue": queue} if queue else {}),
                            **({"priority": _priority(priority)} if queue and priority else {}),
                            **({"queue_key": _queue_key(queue_key)} if queue and queue_key is not None else {}))
        if go.get("ok", True):
            return go.get("result")
        raise ChildFailed(f"child flow {flow!r} did not complete: {go.get('error', '')}")

    async def patched(self, patch_id: str) -> bool:
        """Whether this run takes the path of code changed under `patch_id` (as Temporal's
        `workflow.patched`): True where the run comes to this point with this code (a new run, or
        one whose history ends before it), False where its history was made by the code before
        the change, which it must then replay. So a flow can change while runs of it are in
        flight: keep both paths until no run from before the change is left, then drop the call
        and the old path (a run that recorded the patch passes over its mark on replay)."""
        if not isinstance(patch_id, str) or not patch_id:
            raise ValueError("a patch id is a non-empty string")
        seq = self._seq
        if seq < len(self._journal):
            at = seq   # its mark, perhaps after marks of patches whose calls the code has dropped since
            while at < len(self._journal) and self._journal[at]["op"] == "patch":
                if self._journal[at]["name"] == patch_id:
                    self._seq = at + 1
                    return True
                at += 1
            return False   # the old code's operation is recorded here
        go = await self._op("patch", patch_id)
        if go["action"] == "skip":   # the old code's operation, in flight when its worker died, is here
            self._seq = seq
            return False
        return True

    async def emit(self, value: Any) -> None:
        """Emit a value to the run's readers: durable in the run's journal before this returns,
        in order, once (a replay does not emit again). `GET /v1/runs/{id}/emitted` pages them,
        or follows them as server-sent events while the run goes on: progress, partial results,
        a model's output as it comes (as DBOS's streams or LangGraph's custom stream)."""
        check_encodable(value, "an emitted value", json=True)
        await self._op("emit", "emit", value=value)

    async def set_attr(self, key: str, value: Any) -> None:
        """Set one of the run's attributes (journaled; readable without a worker)."""
        check_encodable(value, f"attribute {key!r}", json=True)
        await self._op("attr_set", key, key=key, value=value)
        self._attrs[key] = value


_PARAMS: dict[Any, frozenset] = {}


def _parameters(fn: Callable) -> frozenset:
    names = _PARAMS.get(fn)
    if names is None:
        try:
            names = frozenset(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = frozenset()
        _PARAMS[fn] = names
    return names
