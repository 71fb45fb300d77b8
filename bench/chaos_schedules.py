"""A schedule under chaos: one schedule that starts a run every second, made before the kills and
deleted after them; every second between must have started its run, and that run must complete
like any run of the flow clients' flow.

Its catch-up is 600 s, so a time whose start a kill interrupted (of the schedule's actor, of the
run's, of the broker or a writer) or that passed while the schedule's actor was down or stopped
is started when that actor is back. (With the default 60 s, a time older than that when its
actor came back is skipped, as documented: on a machine starved to a tenth of a CPU an actor
took 50 s to come back from its kill, and its time in flight then was past the catch-up.) Its runs go into the ledger's flows: the verification asks
each for its result, and a time with no run is lost.
"""
from __future__ import annotations

import asyncio
import math
import time

import aiohttp

NAME = "chaos-every-second"
MARGIN_SECS = 2.0     # the times this close to its making or its deletion are not counted
CATCHUP_SECS = 600


async def _until_answered(http, method: str, url: str, body: dict | None, ok: tuple[int, ...]) -> tuple[int, dict]:
    for _ in range(120):
        try:
            async with http.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                answer = await resp.json(content_type=None) if resp.status != 204 else {}
                if resp.status in ok:
                    return resp.status, answer
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{method} {url}: no answer in {ok} after 120 tries")


async def make_schedule(http, base: str, flow: str, input) -> float:
    """The schedule, made (or made again: a PUT is idempotent); the time it counts from."""
    _, body = await _until_answered(http, "PUT", f"{base}/v1/schedules/{NAME}",
                                    {"flow": flow, "cron": "* * * * * *", "input": input, "catchup_secs": CATCHUP_SECS},
                                    (200, 201))
    return body["updated_at"]


async def delete_schedule(http, base: str) -> float:
    """The schedule, deleted (a 404: an answer lost to a kill, of a try that did it); a time
    before it stopped: when the first try was sent."""
    sent = time.time()
    await _until_answered(http, "DELETE", f"{base}/v1/schedules/{NAME}", None, (204, 404))
    return sent


def expected_runs(made: float, deleted: float) -> list[str]:
    """The runs it must have started: one per second between, as the server names them."""
    first, last = math.ceil(made + MARGIN_SECS), math.floor(deleted - MARGIN_SECS)
    return [f"{NAME}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(t))}" for t in range(first, last + 1)]
