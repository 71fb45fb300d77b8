"""The flows the step benchmark runs on its workers: trivial bodies, so the cost measured is
the framework's (journal, bus, scheduling), as in the reference benchmark."""
import asyncio
import time

from actors.sdk import App, WaitTimeout, tool

STEPS_PER_FLOW = 10
BIG = 16 * 1024


def noop(i):
    return i


def now():
    return time.time()


async def _timed_steps(ctx, n, durability):
    """Runs n steps; returns how long each took, in ms, as the flow saw it (call to result)."""
    took = []
    for i in range(n or STEPS_PER_FLOW):
        began = time.perf_counter()
        await ctx.step(noop, i, durability=durability)
        took.append(round((time.perf_counter() - began) * 1000.0, 4))
    return took


async def sync_steps(ctx, n):
    """n SYNC steps; returns n (the chaos run checks it)."""
    await _timed_steps(ctx, n, "sync")
    return n


async def async_steps(ctx, n):
    await _timed_steps(ctx, n, "async")
    return n


async def timed_sync_steps(ctx, n):
    """As sync_steps, returning each step's latency (the step benchmark's flows)."""
    return await _timed_steps(ctx, n, "sync")


async def timed_async_steps(ctx, n):
    return await _timed_steps(ctx, n, "async")


async def timed_fanned_steps(ctx, n):
    """n SYNC steps at once; each one's latency as the flow saw it (call to result), in ms."""
    async def timed(i):
        began = time.perf_counter()
        await ctx.step(noop, i)
        return round((time.perf_counter() - began) * 1000.0, 4)
    return list(await asyncio.gather(*(timed(i) for i in range(n or STEPS_PER_FLOW))))


async def fanned_steps(ctx, n):
    """n SYNC steps at once, then two children of n steps at once (asyncio.gather); returns n if
    each result is at its place (the chaos run checks it), else what came back."""
    got = await asyncio.gather(*(ctx.step(noop, i) for i in range(n)))
    children = await asyncio.gather(*(ctx.child(sync_steps, n) for _ in range(2)))
    return n if list(got) == list(range(n)) and children == [n, n] else {"steps": got, "children": children}


async def chosen(ctx, n):
    """Waits for the first message on `approve` or `reject` (ctx.wait_any; the chaos client
    publishes one, its own channel's name, to either, has a `messenger` run send it, or publishes
    it to the tenant's channel for the run whose `ticket` attribute the input, {"n", "ticket"},
    names), emits which channel it took, then n SYNC steps; returns n if the message came on the
    channel it names and no second copy came (a publish retried under its key, or a send its run
    replayed, is taken once), else what came."""
    if isinstance(n, dict):
        await ctx.set_attr("ticket", n["ticket"])
        n = n["n"]
    channel, message = await ctx.wait_any(["approve", "reject"])
    await ctx.emit({"took": channel})   # (its reader finds it once, whatever executions came after)
    await _timed_steps(ctx, n, "sync")
    try:
        extra = await ctx.wait_any(["approve", "reject"], timeout=0)
    except WaitTimeout:
        extra = None
    return n if message == channel and extra is None else {"channel": channel, "message": message, "extra": extra}


async def messenger(ctx, args):
    """Sends a `chosen` run its message (ctx.send); returns args["n"]."""
    await ctx.send(args["to"], args["channel"], args["channel"])
    return args["n"]


def _now() -> float:
    return time.time()


async def listener(ctx, group):
    """Names its `group` in an attribute, waits on `go` (the tenant's channel, or its own), then
    takes one step: returns the seconds from the message's `sent` to that step
    (bench/broadcasts.py)."""
    await ctx.set_attr("group", group)
    message = await ctx.wait("go")
    woke = await ctx.step(_now, name="woken")
    return woke - message["sent"]


async def one_step(ctx, _):
    return await ctx.step(noop, 1)


async def holder(ctx, args):
    """Holds attributes for the read and update scenarios, then waits forever (no worker held)."""
    for key, value in (args or {}).items():
        await ctx.set_attr(key, value)
    await ctx.wait("never")


async def woken(ctx, _):
    """Waits for one message; the step after the wake records when it started."""
    await ctx.wait("wake")
    return await ctx.step(now)


@tool(description="Look something up", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
async def lookup(q=""):
    """A chaos turn's tool (bench/chaos_clients.py), called beside `tally`: it takes long enough
    for a cancel to land while it runs."""
    await asyncio.sleep(0.2)
    return {"q": q, "hits": len(q)}


@tool(description="Count the words", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
def tally(q=""):
    return {"words": len(q.split())}


def incr(value, arg):
    return (value or 0) + (arg or 1)


app = App(flows=[sync_steps, async_steps, timed_sync_steps, timed_async_steps, timed_fanned_steps, fanned_steps,
                 chosen, messenger, one_step, holder, woken, listener], tools=[lookup, tally],
          updates={"incr": incr})
_ = BIG
