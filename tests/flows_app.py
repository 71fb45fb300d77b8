"""Flows, tools and update handlers the end-to-end tests run on a real worker.

Side effects go to files named by the run's input, so a test can count how many times each
step really ran (across worker kills and actor restarts)."""
import asyncio
import os
import threading
import time

import flows_fanout as fanout
from actors.sdk import App, NO_RETRY, Retry, tool


def effect(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def through_gate(gate: str | None) -> None:
    """Wait (at most a minute) until the file `gate` exists: the test opens it when it is ready
    for what follows, however long its own actions took on a loaded machine."""
    for _ in range(600 if gate else 0):
        if os.path.exists(gate):
            return
        await asyncio.sleep(0.1)


async def slow_effect(path: str, n: int, delay: float, gate: str | None = None) -> int:
    effect(path + ".starts", f"start {n} pid={os.getpid()}")
    await asyncio.sleep(delay)          # a kill lands here: before the side effect
    await through_gate(gate)
    effect(path, f"step {n}")
    return n * 10


async def five_steps(ctx, args):
    total = 0
    for n in range(5):
        gate = args.get("gate") if n == args.get("gate_step") else None
        delay = args["delays"][n] if "delays" in args else args.get("delay", 0.3)
        total += await ctx.step(slow_effect, args["file"], n, delay, gate, name=f"step-{n}",
                                retry=Retry(max_attempts=5, backoff_secs=0.05))
    return total


async def async_then_sync(ctx, args):
    """A slow ASYNC step, its result committed after the flow goes on, then a SYNC one."""
    first = await ctx.step(slow_effect, args["file"], 0, args["delay"], args.get("gate"), name="slow",
                           durability="async")
    return first + await ctx.step(slow_effect, args["file"], 1, 0.0, name="quick")


async def async_then_sleep(ctx, args):
    """An ASYNC step whose result is sent while the run's actor may be stalled, then a durable
    sleep: the run's next execution replays its journal up to the first hole."""
    first = await ctx.step(slow_effect, args["file"], 0, 0.0, args["gate"], name="slow", durability="async")
    await ctx.sleep(args["secs"])
    return first + await ctx.step(slow_effect, args["file"], 1, 0.0, name="quick")


async def async_gate_sleep(ctx, args):
    """An ASYNC step, then work that is no operation (until `then` exists), then a short durable
    sleep: the sleep's request can reach the actor before a resent result of the step."""
    first = await ctx.step(slow_effect, args["file"], 0, 0.0, args["gate"], name="slow", durability="async")
    await through_gate(args["then"])
    await ctx.sleep(args["secs"])
    return first + await ctx.step(slow_effect, args["file"], 1, 0.0, name="quick")


async def stamp(path: str, label: str) -> float:
    effect(path, label)
    return time.time()


def journaled(wal_dir: str, run_id: str, seq: int) -> bool:
    """Is the outcome of operation `seq` of `run_id` in the write-ahead log on disk right now?"""
    from pathlib import Path

    from storage import records, segments
    for writer in sorted(Path(wal_dir).iterdir()):
        for _, path in segments.list_segments(writer):
            for _, kind, _, body, _ in records.scan(path.read_bytes()):
                if kind == records.RecordKind.FLOW:
                    rec = records.decode_body(body)
                    if rec.get("run") == run_id and rec.get("type") == "step.done" and rec.get("seq") == seq:
                        return True
    return False


async def sync_then_check(ctx, args):
    """A SYNC step, then a step that looks for the first one's result in the log on disk."""
    await ctx.step(stamp, args["file"], "first", durability=args.get("durability", "sync"))
    return await ctx.step(journaled, args["wal"], ctx.run_id, 0)


async def sleeper(ctx, args):
    started = await ctx.step(stamp, args["file"], "before", name="before")
    await ctx.sleep(args["secs"])
    ended = await ctx.step(stamp, args["file"], "after", name="after")
    return ended - started


async def waiter(ctx, args):
    if args.get("delay"):
        await ctx.step(asyncio.sleep, args["delay"], name="delay")
    first = await ctx.wait("inbox", timeout=args.get("timeout"))
    second = await ctx.wait("inbox", timeout=args.get("timeout"))
    return [first, second]


async def async_steps(ctx, n):
    values = [await ctx.step(lambda_double, i, durability="async") for i in range(n)]
    return sum(values)


def lambda_double(i):
    return i * 2


async def with_attrs(ctx, args):
    await ctx.set_attr("status", "started")
    await ctx.wait("finish")
    await ctx.set_attr("status", "done")
    return ctx.attrs


async def parent(ctx, n):
    a = await ctx.child("child", n)
    b = await ctx.child(child, n + 1)     # by its function, as well as by its name
    return a + b


async def child(ctx, n):
    return await ctx.step(lambda_double, n)


async def failing(ctx, args):
    return await ctx.step(explode, retry=Retry(max_attempts=2, backoff_secs=0.01))


def explode():
    raise ValueError("boom")


async def flaky(ctx, args):
    return await ctx.step(fail_first, args["file"], retry=Retry(max_attempts=3, backoff_secs=0.01))


def fail_first(path):
    runs = open(path).read().count("x") if os.path.exists(path) else 0
    effect(path, "x")
    if runs == 0:
        raise RuntimeError("first attempt fails")
    return runs + 1


async def branchy(ctx, args):
    """Takes another path when its marker file exists: a deliberately non-deterministic flow."""
    if os.path.exists(args["file"]):
        await ctx.step(lambda_double, 1, name="other")
    else:
        await ctx.step(lambda_double, 1, name="first")
    await ctx.wait("go")
    return "done"


def count_effect(path: str, label: str) -> int:
    effect(path, label)
    return open(path).read().split().count(label)


def needs_marker(marker: str) -> str:
    if not os.path.exists(marker):
        raise RuntimeError("the marker file is missing")
    return "fixed"


async def forkable(ctx, args):
    """Fails at its last step until the marker file exists (a bug a deploy fixes): a fork goes on
    from that step with what came before replayed."""
    a = await ctx.step(count_effect, args["file"], "a", name="a")
    await ctx.set_attr("stage", "waiting")
    doubled = await ctx.child("child", 1)
    message = await ctx.wait("approve")
    b = await ctx.step(needs_marker, args["marker"], name="b", retry=NO_RETRY)
    return {"a": a, "child": doubled, "message": message, "b": b}


def incr(value, arg):
    return (value or 0) + (arg or 1)


async def unencodable(ctx, args):
    """Returns what msgpack cannot carry: the run must fail, not be retried for ever."""
    return object()


def unencodable_update(value, arg):
    return object()


async def returns_bytes(ctx, args):
    """msgpack carries bytes, but a run's result is read over HTTP as JSON: its GET answered 500."""
    return {"raw": b"\x00\xff"}


async def bytes_step(ctx, args):
    """A step may return what msgpack carries and JSON does not: its run ends fine."""
    raw = await ctx.step(raw_bytes)
    return len(raw)


def raw_bytes():
    return b"\x00\xff"


def chunk(i, n):
    return str(i % 10) * n


_blocking = {"now": 0, "peak": 0}
_blocking_lock = threading.Lock()


def blocking_io(seconds, gate=None, marks=None):
    """A plain function that blocks (as a requests.get would): it runs on a thread of the worker.
    With `marks` it says it began there; with `gate` it returns as soon as that file exists."""
    with _blocking_lock:
        _blocking["now"] += 1
        _blocking["peak"] = max(_blocking["peak"], _blocking["now"])
    if marks:
        effect(marks, "on a thread")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (gate and os.path.exists(gate)):
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    with _blocking_lock:
        _blocking["now"] -= 1
        return _blocking["peak"]


async def one_blocking_step(ctx, args):
    """`args`: the seconds to block, or {"seconds", "gate", "marks"} (see blocking_io)."""
    if isinstance(args, dict):
        return await ctx.step(blocking_io, args["seconds"], args.get("gate"), args.get("marks"))
    return await ctx.step(blocking_io, args)


def hangs_the_first_time(marker: str, seconds: float) -> str:
    """A plain function that hangs on its first call (a stuck socket read) and returns at once after."""
    first = not os.path.exists(marker)
    effect(marker, "called")
    if first:
        time.sleep(seconds)
        return "late"
    return "done"


async def stuck_step_then_retry(ctx, args):
    """A blocking step past its timeout; its retry must not wait behind the stuck thread."""
    return await ctx.step(hangs_the_first_time, args["marker"], args["seconds"], timeout=args["timeout"],
                          retry=Retry(max_attempts=3, backoff_secs=0.05))


async def kills_its_worker(ctx, args):
    """Flow code that takes its worker process down (a crash in a C extension, the OOM killer)."""
    os._exit(3)


async def sleeps_an_hour(ctx, args):
    await ctx.sleep(3600)


async def parent_of_sleeper(ctx, args):
    return await ctx.child(sleeps_an_hour, {}, run_id=args["child"])


async def parent_of_waiter(ctx, args):
    return await ctx.child(waiter, {}, run_id=args["child"])


async def big_steps(ctx, args):
    """`steps` results of `n` characters each, then a wait: the next execution replays them all."""
    sizes = [len(await ctx.step(chunk, i, args["n"], name=f"chunk-{i}")) for i in range(args["steps"])]
    await ctx.wait("go")
    return sum(sizes)


async def ticked(ctx, args):
    """A schedule's flow: one line per run, its id."""
    return await ctx.step(stamp, args["file"], ctx.run_id)


@tool(description="Look up the weather in a city",
      parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
def get_weather(q):
    marker = os.environ.get("FLOWS_APP_TOOL_MARKER")
    if marker:
        effect(marker, f"weather {q}")
    beside = os.environ.get("FLOWS_APP_WEATHER_BESIDE")   # a file `search` makes as it starts
    if beside:   # it returns only once a search runs beside it: proof that the two run at once
        for _ in range(300):
            if os.path.exists(beside):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("no search started while the weather was looked up")
    if os.environ.get("FLOWS_APP_WEATHER_SECS"):   # a slow lookup, its end marked
        time.sleep(float(os.environ["FLOWS_APP_WEATHER_SECS"]))
        effect(marker, f"weather done {q}")
    return {"city": q, "forecast": "sunny", "celsius": 21}


@tool(description="Search the web", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
async def search(q):
    if os.environ.get("FLOWS_APP_WEATHER_BESIDE"):
        effect(os.environ["FLOWS_APP_WEATHER_BESIDE"], "search started")
    marker = os.environ.get("FLOWS_APP_TOOL_MARKER")
    if marker:
        effect(marker, f"search {q}")
        try:
            await asyncio.sleep(float(os.environ.get("FLOWS_APP_TOOL_DELAY", "0")))
            await through_gate(os.environ.get("FLOWS_APP_TOOL_GATE"))
        except asyncio.CancelledError:
            effect(marker, f"search cancelled {q}")
            raise
        effect(marker, f"search done {q}")
    return {"results": [f"result for {q}"]}


async def occupy(path: str, run_id: str, secs: float) -> str:
    effect(path, f"+ {run_id}")
    await asyncio.sleep(secs)
    effect(path, f"- {run_id}")
    return run_id


async def queued(ctx, args):
    """One step that holds on a while, logged as it begins and ends: how many runs of a flow
    queue run at once, read from one file."""
    return await ctx.step(occupy, args["file"], ctx.run_id, args.get("secs", 0.5), name="occupy")


def old_step(path: str) -> str:
    effect(path, "old step")
    return "old"


def new_step(path: str) -> str:
    effect(path, "new step")
    return "new"


async def versioned(ctx, args):
    """A flow whose code changes while a run of it waits (flows_app_v2.py has the new code)."""
    first = await ctx.step(old_step, args["file"])
    message = await ctx.wait("go")
    return {"first": first, "message": message}


async def parent_in_queue(ctx, args):
    return await ctx.child(queued, args, run_id=args["child"], queue=args["queue"], priority=args.get("priority", 0))


@tool(description="Read a file's raw bytes", parameters={"type": "object", "properties": {"q": {"type": "string"}}})
def read_raw(q):
    return {"name": q, "bytes": b"\x00\x01"}   # msgpack carries bytes; JSON, what the model reads, does not


app = App(flows=[five_steps, async_then_sync, async_then_sleep, async_gate_sleep, sync_then_check, sleeper, waiter, async_steps, with_attrs, parent, child, failing,
                 flaky, branchy, unencodable, returns_bytes, big_steps, sleeps_an_hour, parent_of_sleeper,
                 parent_of_waiter, one_blocking_step, kills_its_worker,
                 stuck_step_then_retry, bytes_step, forkable, ticked, queued, parent_in_queue, versioned, *fanout.FLOWS],
          tools=[get_weather, search, read_raw], updates={"incr": incr, "unencodable": unencodable_update})
