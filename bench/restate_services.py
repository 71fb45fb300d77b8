"""The step-benchmark scenarios written the Restate way, and the process that serves them.

Owns: the Restate services (one per scenario family), the ASGI app built from them, and the
`python -m bench.restate_services --fd N` entry point that serves that app with hypercorn on
uvloop from a listening socket the parent created (so the port is known before the child starts
and no free-port race exists). granian serves the same app through `make_app` (peer_restate).
Never does: start Restate, register itself, or generate load (that is bench/peer_restate.py and
bench/restate_load.py).

Bodies are trivial on purpose, so that what a run measures is the framework's cost per step,
call, state access or wake. Step actions are `async def`: the SDK runs a plain function given to
`ctx.run_typed` in a thread-pool executor, which would add two thread hops per step that no
Restate user needs to pay.

| service / handler  | kind              | what it does                                        |
|--------------------|-------------------|-----------------------------------------------------|
| `Steps/sync10`     | service           | 10 `ctx.run_typed` steps, one by one                |
| `Steps/async10`    | service           | 10 steps created, then one `restate.gather`         |
| `Steps/ping`       | service           | nothing (readiness probe)                           |
| `Flow/{id}/run`    | workflow main     | one step                                            |
| `Attr/{key}/get`   | object, shared    | reads state key `v`                                 |
| `Attr/{key}/incr`  | object, exclusive | `v += 1` (read-modify-write)                        |
| `Big/{key}/fill`   | object, exclusive | writes ten values `a0`…`a9` of N bytes              |
| `Big/{key}/read10` | object, shared    | returns the ten values                              |
| `Wake/{id}/run`    | workflow main     | resolves `ready`, waits on `wake`, then runs one    |
|                    |                   | step whose action returns time.time()               |
| `Wake/{id}/wake`   | workflow, shared  | waits for `ready`, takes time.time(), resolves      |
|                    |                   | `wake`, returns that time                           |

`Big` is its own object (not more keys on `Attr`) because Restate sends an object's whole state
with every invocation by default (eager state): 160 KiB on `Attr` would tax every `get`.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import random
import signal
import socket
import sys
import time

import restate
from restate import (
    Context,
    ObjectContext,
    ObjectSharedContext,
    RunOptions,
    WorkflowContext,
    WorkflowSharedContext,
)

STEPS_PER_CALL = 10
BIG_VALUES = 10
SHUTDOWN_GRACE_SECS = 2.0
# type_hint given up front: otherwise the SDK inspects the action's signature on every step.
_INT = RunOptions(type_hint=int)
_FLOAT = RunOptions(type_hint=float)


async def _step(i: int) -> int:
    return i + 1


async def _now() -> float:
    return time.time()


def big_value(key: str, index: int, size_bytes: int) -> str:
    """`size_bytes` ASCII characters, different per key and index and not trivially compressible."""
    raw = random.Random(f"{key}/{index}").randbytes(size_bytes * 3 // 4 + 3)
    return base64.b64encode(raw).decode("ascii")[:size_bytes]


# ------------------------------------------------------------------------------------ steps
steps = restate.Service("Steps")


@steps.handler()
async def sync10(ctx: Context) -> int:
    total = 0
    for i in range(STEPS_PER_CALL):
        total += await ctx.run_typed("step", _step, _INT, i)
    return total


@steps.handler()
async def async10(ctx: Context) -> int:
    futures = [ctx.run_typed("step", _step, _INT, i) for i in range(STEPS_PER_CALL)]
    await restate.gather(*futures)
    return sum([await f for f in futures])


@steps.handler()
async def ping(ctx: Context) -> str:
    return "pong"


# ------------------------------------------------------------------------------------ flows
flow = restate.Workflow("Flow")


@flow.main(name="run")
async def run_one_step(ctx: WorkflowContext) -> int:
    return await ctx.run_typed("step", _step, _INT, 1)


# ------------------------------------------------------------------------------- attributes
attr = restate.VirtualObject("Attr")


@attr.handler(kind="shared")
async def get(ctx: ObjectSharedContext) -> int:
    return await ctx.get("v", type_hint=int) or 0


@attr.handler()
async def incr(ctx: ObjectContext) -> int:
    value = (await ctx.get("v", type_hint=int) or 0) + 1
    ctx.set("v", value)
    return value


big = restate.VirtualObject("Big")


@big.handler()
async def fill(ctx: ObjectContext, size_bytes: int) -> int:
    for i in range(BIG_VALUES):
        ctx.set(f"a{i}", big_value(ctx.key(), i, size_bytes))
    return BIG_VALUES


@big.handler(kind="shared")
async def read10(ctx: ObjectSharedContext) -> list[str]:
    return [await ctx.get(f"a{i}", type_hint=str) or "" for i in range(BIG_VALUES)]


# ------------------------------------------------------------------------------------ wakes
wake_flow = restate.Workflow("Wake")


@wake_flow.main(name="run")
async def wait_for_wake(ctx: WorkflowContext) -> dict:
    await ctx.promise("ready", type_hint=bool).resolve(True)
    client_sent_at = await ctx.promise("wake", type_hint=float).value()
    step_started_at = await ctx.run_typed("after_wake", _now, _FLOAT)
    return {"client_sent_at": client_sent_at, "step_started_at": step_started_at}


@wake_flow.handler()
async def wake(ctx: WorkflowSharedContext, client_sent_at: float) -> float:
    # Waiting for `ready` means the main handler has reached its wait: the time taken next is
    # the moment the resolve is issued to Restate, with the woken side already waiting.
    await ctx.promise("ready", type_hint=bool).value()
    resolved_at = time.time()
    await ctx.promise("wake", type_hint=float).resolve(client_sent_at)
    return resolved_at


SERVICES = (steps, flow, attr, big, wake_flow)


def make_app():
    return restate.app(services=SERVICES)


# ------------------------------------------------------------------------------------ process
async def serve(sock: socket.socket) -> None:
    import hypercorn.asyncio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.graceful_timeout = SHUTDOWN_GRACE_SECS
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await hypercorn.asyncio.serve(make_app(), config, shutdown_trigger=stop.wait)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--fd", type=int, required=True,
                        help="inherited listening TCP socket to serve on")
    parser.add_argument("--title", default="agent-os: restate-service", help="process title")
    args = parser.parse_args(argv)
    import setproctitle
    import uvloop

    setproctitle.setproctitle(args.title)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us with SIGTERM
    sock = socket.socket(fileno=args.fd)
    uvloop.run(serve(sock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
