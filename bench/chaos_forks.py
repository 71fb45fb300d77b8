"""Forks under chaos: the flow clients fork some of their runs, the turn clients some of their
sessions, while roles are killed; a fork the server acknowledged must be there after.

A run's fork (`POST /v1/runs/{id}:fork`, from its first operation, under an Idempotency-Key so a
retry answers the same fork) must complete with the same result as any run of the flow: it goes
into the ledger's runs. A session's fork (`POST /v1/sessions/{sid}/fork` into a new id) must hold
as many messages as its answer said.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from bench.chaos_clients import Ledger

RUN_FORK_EVERY = 3        # every third run a flow client started is forked
SESSION_FORK_EVERY = 5    # every fifth completed turn of a turn client forks its session


async def fork_run(http, base: str, run_id: str, key: str, ledger: "Ledger", stop: asyncio.Event) -> None:
    for _ in range(20):   # the same key until the server answers: a retry never makes a second fork
        try:
            async with http.post(f"{base}/v1/runs/{run_id}:fork", json={"from_seq": 0},
                                 headers={"Idempotency-Key": key}, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                body = await resp.json(content_type=None)
                if resp.status in (200, 201):
                    ledger.flows[body["run_id"]] = key
                    ledger.forks["runs"] += 1
                    return
                ledger.fork_errors[f"run {resp.status}"] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            ledger.fork_errors["run connection"] += 1
        if stop.is_set():
            return
        await asyncio.sleep(0.5)


async def fork_session(http, base: str, session: str, into: str, ledger: "Ledger") -> None:
    """Once: an answer lost to a kill leaves a fork that may or may not be there, and is not counted."""
    try:
        async with http.post(f"{base}/v1/sessions/{session}/fork", json={"session_id": into},
                             timeout=aiohttp.ClientTimeout(total=30)) as resp:
            body = await resp.json(content_type=None)
            if resp.status == 201:
                ledger.session_forks[into] = body["messages"]
                ledger.forks["sessions"] += 1
            else:
                ledger.fork_errors[f"session {resp.status}"] += 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        ledger.fork_errors["session connection"] += 1


async def unforked(http, base: str, forks: dict[str, int]) -> list[str]:
    """The acknowledged session forks that do not hold the messages their answer counted."""
    missing = []
    for sid, count in forks.items():
        async with http.get(f"{base}/v1/sessions/{sid}") as resp:
            body = await resp.json(content_type=None)
        if resp.status != 200 or body.get("messages") != count:
            missing.append(sid)
    return missing
