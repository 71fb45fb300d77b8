"""The chaos benchmark's load clients (bench/chaos.py) and the ledger of what the server
acknowledged to them: turns over SSE, numbered checkpoints, flow runs (some through a flow queue)."""
from __future__ import annotations

import asyncio
import collections
import os
import random
import time

import aiohttp

from bench.chaos_forks import RUN_FORK_EVERY, SESSION_FORK_EVERY, fork_run, fork_session
from bench.sse_client import run_turn

FLOW_STEPS = 5
# every QUEUED_EVERY-th run of a flow client waits for one of 2 places, admitted at most 10 a
# second, with a priority of 0, 1 or 2: the queue's places, rate and order through the kills
QUEUE, QUEUE_LIMIT = "chaos", "2@10/1s"
QUEUED_EVERY = 3
# and of the runs with n % 3 == 2 (neither queued nor forked), half run their steps at once, then
# two children at once (bench/steps_app.py fanned_steps), half wait for a message on either of two
# channels (`chosen`: ctx.wait_any), which the client then publishes (to the run's channel, by a
# `messenger` run's ctx.send, or to the tenant's channel for the runs whose attribute names it);
# even clients begin with the first kind, odd ones with the second, so a short run has both
FANNED = 2
# the tools of bench/steps_app.py, both called at once by a turn's model (the mock's marker; "made
# up": called also while a restarted scheduler lists no tools yet, where the model would be told
# that no worker has them, rather than the mock refusing the request)
TOOL_CALLS = "[[mock made_up_tool_calls=lookup,tally]]"


class Ledger:
    """What the server acknowledged, and how every stream ended."""

    def __init__(self) -> None:
        self.turns = collections.Counter()
        self.turn_failures = collections.Counter()         # failed turns by their error code
        self.completed: list[tuple[str, str, str]] = []   # (session, turn id, streamed text)
        self.resumed = 0
        self.reordered = 0
        self.hung: list[dict] = []   # each hung stream: its turn, when posted (s from t0, the kills' clock), how far it got
        self.checkpoints: dict[str, list[int]] = collections.defaultdict(list)   # session -> acknowledged numbers
        self.checkpoint_errors = collections.Counter()
        self.flows: dict[str, str] = {}                   # run id -> idempotency key
        self.emitting: set[str] = set()                   # runs that emit one value, which channel they took
        self.flow_errors = collections.Counter()
        self.closed: list[str] = []                      # sessions whose close was acknowledged
        self.close_errors = collections.Counter()
        self.session_forks: dict[str, int] = {}          # forked session -> the messages it was answered with
        self.forks = collections.Counter()               # acknowledged forks: runs, sessions
        self.fork_errors = collections.Counter()
        self.timeline: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.t0 = time.monotonic()

    def tick(self, what: str) -> None:
        self.timeline[int(time.monotonic() - self.t0)][what] += 1


async def turn_client(http, base: str, index: int, ledger: Ledger, stop: asyncio.Event, deadline: float,
                      pause: float) -> None:
    session, n = f"chaos-t{index}", 0
    while not stop.is_set():
        n += 1
        # Every fourth time two turns at once: one supersedes the other, perhaps before it ran;
        # every seventh the client cancels its turn a few milliseconds in (or, if it asked for
        # tools, while they run).
        texts = [f"turn {n} of client {index}"] + ([f"turn {n}b of client {index}"] if n % 4 == 0 else [])
        tools = n % 3 == 2   # every third asks for two tools at once, and one of those in seven is
        if tools:            # cancelled while they run: a cut that could leave a call unanswered
            texts[0] += f" {TOOL_CALLS}"
        soon = random.uniform(0.08, 0.25) if tools else random.uniform(0.0, 0.03)
        cancel = [_cancel_soon(http, base, session, soon)] if n % 7 == 3 else []
        posted = round(time.monotonic() - ledger.t0, 2)
        outs = (await asyncio.gather(*(run_turn(http, base, session, text, deadline) for text in texts),
                                     *cancel))[:len(texts)]
        for out in outs:
            ledger.turns[out.outcome] += 1
            if out.outcome == "failed":
                ledger.turn_failures[out.error or "unknown"] += 1
            if out.outcome == "hung":
                ledger.hung.append({"session": session, "turn_id": out.turn_id, "posted_at": posted,
                                    "last_event_id": out.last_id, "resumes": out.resumes, "status": out.status})
            ledger.resumed += out.resumes > 0
            ledger.reordered += not out.gapless
            if out.outcome == "completed":
                ledger.completed.append((session, out.turn_id, out.text))
                ledger.tick("turns")
                if len(ledger.completed) % SESSION_FORK_EVERY == 0:
                    await fork_session(http, base, session, f"chaos-fork-{len(ledger.completed)}", ledger)
        refused = any(out.outcome in ("refused", "rejected") for out in outs)
        await asyncio.sleep(pause if not refused else 0.5)


async def _cancel_soon(http, base: str, session: str, after: float) -> None:
    await asyncio.sleep(after)
    try:
        async with http.delete(f"{base}/v1/sessions/{session}/turns/current",
                               timeout=aiohttp.ClientTimeout(total=30)) as resp:
            await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass    # a kill in the way: the turn then simply runs to its end


async def checkpoint_client(http, base: str, index: int, ledger: Ledger, stop: asyncio.Event, pause: float) -> None:
    session, n = f"chaos-c{index}", 0
    padding = os.urandom(1024).hex().encode()
    while not stop.is_set():
        n += 1
        try:
            async with http.put(f"{base}/v1/sessions/{session}/checkpoints/v{n}", data=b"%d:" % n + padding,
                                timeout=aiohttp.ClientTimeout(total=30)) as resp:
                await resp.read()
                if resp.status == 200:
                    ledger.checkpoints[session].append(n)
                    ledger.tick("checkpoints")
                else:
                    ledger.checkpoint_errors[resp.status] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ledger.checkpoint_errors["connection"] += 1
            await asyncio.sleep(0.5)
        await asyncio.sleep(pause)


async def flow_client(http, base: str, index: int, ledger: Ledger, stop: asyncio.Event, pause: float) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        key = f"chaos-f{index}-{n}"
        for _ in range(20):   # the same key until the server answers: a retry never starts a second run
            try:
                body = {"input": FLOW_STEPS}
                if n % QUEUED_EVERY == 1:
                    body.update(queue=QUEUE, priority=n // QUEUED_EVERY % 3)
                flow = "sync_steps" if n % QUEUED_EVERY != FANNED else \
                    "fanned_steps" if (n % 6 == FANNED) == (index % 2 == 0) else "chosen"
                if flow == "chosen" and broadcast_to(n, index):   # (woken through the ticket it names)
                    body["input"] = {"n": FLOW_STEPS, "ticket": key}
                async with http.post(f"{base}/v1/flows/{flow}/runs", json=body,
                                     headers={"Idempotency-Key": key},
                                     timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    body = await resp.json(content_type=None)
                    if resp.status in (200, 201):
                        # (a chosen run is owed its result once its message is acknowledged too)
                        if flow != "chosen" or await publish(http, base, body["run_id"], n, index, key, ledger, stop):
                            ledger.flows[body["run_id"]] = key
                        ledger.tick("flows")
                        ledger.forks["queued"] += body.get("queue") == QUEUE
                        ledger.forks["fanned"] += flow == "fanned_steps"
                        if flow == "chosen" and body["run_id"] in ledger.flows:
                            ledger.forks["chosen"] += 1
                            ledger.emitting.add(body["run_id"])
                        if n % RUN_FORK_EVERY == 0:
                            await fork_run(http, base, body["run_id"], f"{key}-fork", ledger, stop)
                        break
                    ledger.flow_errors[resp.status] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                ledger.flow_errors["connection"] += 1
            await asyncio.sleep(0.5)
            if stop.is_set():
                break
        await asyncio.sleep(pause)


def way_of(n: int, index: int) -> str:
    """How chosen run `n` of flow client `index` gets its message: a third each way, an even
    client's first by a publish to the tenant's channel and an odd one's by a messenger, so a
    short run's first two chosen runs (either client's) have those two (a keyed publish, the
    third way, is not counted apart)."""
    return ("keyed", "messenger", "ticket")[(n // 6 + 2 - index % 2) % 3]


def broadcast_to(n: int, index: int) -> bool:
    return way_of(n, index) == "ticket"


async def publish(http, base: str, run_id: str, n: int, index: int, key: str, ledger: Ledger,
                  stop: asyncio.Event) -> bool:
    """The message a `chosen` run waits for, on one of its two channels, sent until acknowledged
    under one Idempotency-Key (the run takes it once, and fails its check if a copy came too); a
    third are sent by a `messenger` run, its ctx.send taken once through the messenger's replays,
    and a third to the tenant's channel for the run whose ticket names it, again until it took it
    (way_of)."""
    channel = ("approve", "reject")[n // 12 % 2]
    if broadcast_to(n, index):
        return await publish_to_ticket(http, base, run_id, channel, key, ledger, stop)
    for _ in range(20):
        try:
            if way_of(n, index) == "messenger":
                resp = await http.post(f"{base}/v1/flows/messenger/runs", headers={"Idempotency-Key": f"{key}-send"},
                                       json={"input": {"to": run_id, "channel": channel, "n": FLOW_STEPS}},
                                       timeout=aiohttp.ClientTimeout(total=30))
            else:
                resp = await http.post(f"{base}/v1/runs/{run_id}/channels/{channel}", json={"message": channel},
                                       headers={"Idempotency-Key": f"{key}-msg"}, timeout=aiohttp.ClientTimeout(total=30))
            async with resp:
                body = await resp.json(content_type=None)
                if resp.status in (200, 201) and "run_id" in body:
                    ledger.flows[body["run_id"]] = f"{key}-send"   # the messenger is owed its result too
                    ledger.forks["messengers"] += resp.status == 201
                    return True
                if resp.status == 202:
                    return True
                ledger.flow_errors[f"publish {resp.status}"] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            ledger.flow_errors["publish connection"] += 1
        if stop.is_set():
            return False
        await asyncio.sleep(0.5)
    return False


async def publish_to_ticket(http, base: str, run_id: str, channel: str, key: str, ledger: Ledger,
                            stop: asyncio.Event) -> bool:
    """`POST /v1/channels/{channel}` for the run whose `ticket` is `key`, under one Idempotency-Key,
    until it took it: delivered to it, or (the answer lost, or the run not waiting yet) its wait
    seen completed. A run not yet waiting gets nothing: sent again until it waits (60 s at most)."""
    for _ in range(120):
        try:
            async with http.post(f"{base}/v1/channels/{channel}", headers={"Idempotency-Key": f"{key}-all"},
                                 json={"message": channel, "flow": "chosen", "where": {"ticket": key}},
                                 timeout=aiohttp.ClientTimeout(total=30)) as resp:
                body = await resp.json(content_type=None)
                if resp.status == 200 and body["delivered"]:
                    ledger.forks["ticketed"] += 1
                    return True
                if resp.status != 200:
                    ledger.flow_errors[f"broadcast {resp.status}"] += 1
            async with http.get(f"{base}/v1/runs/{run_id}/steps", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                steps = (await resp.json(content_type=None)).get("steps", []) if resp.status == 200 else []
            if any(s["op"] == "wait" and s["status"] == "completed" for s in steps):
                ledger.forks["ticketed"] += 1
                return True
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            ledger.flow_errors["broadcast connection"] += 1
        if stop.is_set():
            return False
        await asyncio.sleep(0.5)
    return False
