"""The Python SDK: durable flows, their steps, tools and attribute-update handlers.

A flow is a plain `async def flow(ctx, input)`. Every `await ctx.step(fn, ...)` is journaled by
the run's owning actor, so when the flow runs again (after a crash, or to continue after a
sleep or a wait) completed steps return their recorded result instead of running again.

**Flow code must be deterministic.** On replay it must ask for the same operations (steps,
sleeps, waits, child flows, attribute writes) in the same order with the same names; anything
that differs between runs (time, randomness, I/O) belongs inside a step. A replay that takes
another path fails the run with a `NonDeterministic` error naming the operation. To change a
flow while runs of it are in flight, branch on `await ctx.patched("an-id")` (below).

Operations may run at once (`await asyncio.gather(ctx.step(a), ctx.step(b))`, children alike):
each takes its place in the journal when it is called, so a replay finds it there whatever
order they finished in. Keep each branch to one operation (a branch of several takes places
that depend on when the others finish): a branch of several belongs in a child flow. A sleep or
a wait waits for the operations before it, and those after a sleep, wait or child wait for it
to be answered, so a run parks with no step in flight.

Declare what a worker runs in one explicit table and point `agent-os worker` at it:

    from actors.sdk import App, Retry, tool

    async def charge(order_id):                     # a step: any function, sync or async
        ...

    async def order(ctx, order_id):                 # a flow
        receipt = await ctx.step(charge, order_id, retry=Retry(max_attempts=5))
        await ctx.sleep(3600)                       # durable: no worker is held meanwhile
        approval = await ctx.wait("approval", timeout=86400)
        kind, note = await ctx.wait_any(["approve", "reject"])   # whichever comes first
        await ctx.send("billing-7", "paid", {"order": order_id})   # another run's channel, taken once
        await ctx.publish("shipped", order_id, where={"order": order_id})   # each run waiting on it now
        await ctx.emit({"stage": "charged"})       # to readers of GET /v1/runs/{id}/emitted (SSE)
        await ctx.set_attr("status", "done")
        return receipt

    def add(value, arg):                            # an attribute-update handler
        return (value or 0) + arg

    @tool(description="Look something up", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    def search(q):
        ...

    app = App(flows=[order], tools=[search], updates={"add": add})

    $ agent-os worker mymodule            # finds `app` in mymodule
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from actors.flow_context import FlowContext
from actors.flow_types import (NO_RETRY, ChildFailed, NonDeterministic, Retry, SendFailed, StepContext, StepFailed,
                               WaitTimeout)

__all__ = ["App", "Retry", "NO_RETRY", "Tool", "tool", "FlowContext", "StepContext", "StepFailed",
           "NonDeterministic", "WaitTimeout", "ChildFailed", "SendFailed"]


@dataclass(frozen=True)
class Tool:
    """A function the agent loop may call, with the JSON schema advertised to the model."""
    fn: Callable[..., Any]
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tool(fn: Callable | None = None, *, name: str | None = None, description: str = "",
         parameters: dict | None = None):
    """Wrap a function as a `Tool` (it registers nothing: list it in an `App`)."""
    def wrap(f: Callable) -> Tool:
        return Tool(f, name or f.__name__, description or (inspect.getdoc(f) or "").split("\n")[0],
                    parameters or {"type": "object", "properties": {}})
    return wrap(fn) if fn is not None else wrap


class App:
    """Everything one worker can run: flows by name, tools, update handlers."""

    def __init__(self, flows: list | dict = (), tools: list | dict = (), updates: dict | None = None) -> None:
        self.flows: dict[str, Callable] = dict(flows) if isinstance(flows, dict) else {f.__name__: f for f in flows}
        items = tools.values() if isinstance(tools, dict) else tools
        self.tools: dict[str, Tool] = {}
        for item in items:
            t = item if isinstance(item, Tool) else tool(item)
            self.tools[t.name] = t
        self.updates: dict[str, Callable] = dict(updates or {})
        for name, fn in self.flows.items():
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"flow {name!r} must be an async function taking (ctx, input)")
