"""Flows whose operations run at once (asyncio.gather), for tests/flows_app.py's worker: steps
that each return only once the others have begun beside them, so a run that took them one after
another fails; a wait on several channels at once (ctx.wait_any), messages to another run
(ctx.send), and runs that wait on a channel of the tenant (POST /v1/channels/{name})."""
import asyncio
import os

from actors.sdk import Retry, SendFailed, WaitTimeout


def note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def lines_of(path: str) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


async def meet(path: str, name: str, others: int, fail_first: bool = False, step=None) -> str:
    """A step that returns only once `others` more steps have begun beside it (else it fails):
    proof that they run at once. `fail_first`: its first attempt fails."""
    note(path, f"begin {name}")
    if fail_first and step.attempt == 1:
        raise RuntimeError("a first attempt that fails")
    for _ in range(600):   # (30 s: the others' start may wait on a starved machine)
        if len(lines_of(path)) > others:
            return name
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{name}: no other step began beside it")


async def fan_out(ctx, args):
    """Steps at once, a durable sleep (the next execution replays them), then steps at once
    again: each result at its place whatever order they finished in."""
    first = await asyncio.gather(*(ctx.step(meet, args["file"], n, 2, n == "a", name=f"meet-{n}",
                                            retry=Retry(max_attempts=2, backoff_secs=0.05)) for n in ("a", "b", "c")))
    await ctx.sleep(0.2)
    second = await asyncio.gather(ctx.step(meet, args["file2"], "d", 1, name="meet-d"),
                                  ctx.step(meet, args["file2"], "e", 1, name="meet-e"))
    return first + second


async def met(ctx, args):
    """A child that meets its siblings (a step that returns once the others have begun)."""
    return await ctx.step(meet, args["file"], args["name"], args["others"], name="meet")


async def fan_out_children(ctx, args):
    """Children at once, then a step: the parent parks on all of them, and goes on once."""
    names = ("a", "b", "c")
    got = await asyncio.gather(*(ctx.child(met, {"file": args["file"], "name": n, "others": len(names) - 1})
                                 for n in names))
    await ctx.step(note, args["file"] + ".after", "after", name="after")
    return got + ["after"]


async def gate(path: str) -> None:
    """A step that returns once `path` exists (the test has published what the flow is to find)."""
    for _ in range(600):
        if os.path.exists(path):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{path} never came")


async def chooser(ctx, args):
    """One wait for approve or reject, a step, then another such wait, or its timeout: each
    wait's channel and message at its place."""
    if args.get("gate"):
        await ctx.step(gate, args["gate"], name="gate")
    first = await ctx.wait_any(["approve", "reject"])
    await ctx.step(note, args["file"], f"took {first[0]}", name="took")
    try:
        second = list(await ctx.wait_any(["approve", "reject"], timeout=args.get("timeout", 0.3)))
    except WaitTimeout:
        second = "timed out"
    return [list(first), second]


async def sender(ctx, args):
    """Two messages to another run's inbox, then one to a run that does not exist."""
    await ctx.send(args["to"], "inbox", "hello")
    await ctx.send(args["to"], "inbox", "again")
    try:
        await ctx.send("no-such-run", "inbox", "lost")
    except SendFailed as exc:
        return str(exc)
    return "sent to no run"


async def whoami(ctx, _):
    """Its own id, as the flow sees it; then a message to itself under that id."""
    await ctx.send(ctx.run_id, "self", "note")
    return [ctx.run_id, await ctx.wait("self")]


async def subscriber(ctx, args):
    """Names its invoice in an attribute, then waits for a message on `paid` (published to the
    tenant's channel, not to this run): the messages it took, until `until` or a timeout."""
    await ctx.set_attr("invoice", args["invoice"])
    took = []
    while not took or took[-1] != args.get("until", took[-1]):
        try:
            took.append(await ctx.wait("paid", timeout=args.get("timeout", 60)))
        except WaitTimeout:
            break
    return took


async def announcer(ctx, args):
    """Publishes to the subscribers waiting on `paid` (those `where` chooses): how many took it."""
    return await ctx.publish("paid", args["message"], flow="subscriber", where=args.get("where"))


async def progress(ctx, args):
    """Emits `count` values ({"step": i}), each after a message on `next` but the first: what its
    readers follow (GET /v1/runs/{id}/emitted); returns "done"."""
    for i in range(args["count"]):
        if i:
            await ctx.wait("next")
        await ctx.emit({"step": i})
    return "done"


FLOWS = [fan_out, met, fan_out_children, chooser, sender, whoami, subscriber, announcer, progress]
