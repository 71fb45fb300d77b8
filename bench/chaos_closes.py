"""Closing sessions under chaos (`agent-os bench chaos`): clients that give a session a turn and a
checkpoint, close it (`DELETE /v1/sessions/{sid}`), and go on to the next; afterwards every
session whose close was acknowledged (204) must stay closed — no read finds anything of it."""
from __future__ import annotations

import asyncio
import collections

import aiohttp

from bench.sse_client import run_turn

CLOSE_TRIES = 20

SESSION_PREFIX = "chaos-x"   # the sessions these clients fill, then close (closed or not: a close may be cut short)


def closable(session: str) -> bool:
    return session.startswith(SESSION_PREFIX)


async def close_client(http, base: str, index: int, closed: list[str], errors: collections.Counter,
                       stop: asyncio.Event, deadline: float, pause: float) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        session = f"{SESSION_PREFIX}{index}-{n}"
        await run_turn(http, base, session, f"a turn of session {n}, to be closed", deadline)
        try:
            async with http.put(f"{base}/v1/sessions/{session}/checkpoints/k", data=b"state of %d" % n,
                                timeout=aiohttp.ClientTimeout(total=30)) as resp:
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass   # what the close must remove is whatever got written
        for _ in range(CLOSE_TRIES):   # a close is idempotent: try until one is acknowledged
            try:
                async with http.delete(f"{base}/v1/sessions/{session}", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    await resp.read()
                    if resp.status == 204:
                        closed.append(session)
                        break
                    errors[resp.status] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                errors["connection"] += 1
            await asyncio.sleep(0.5)
        await asyncio.sleep(pause)


async def reopened(http, base: str, closed: list[str]) -> list[str]:
    """The closed sessions that a read still finds something of."""
    back = []
    for session in closed:
        for path in ("messages", "events", "checkpoints/latest"):
            async with http.get(f"{base}/v1/sessions/{session}/{path}") as resp:
                await resp.read()
                if resp.status != 404:
                    back.append(session)
                    break
    return back
