"""A turn as a client sees it, for the fault benchmarks: post it, read its SSE stream, and pick it
up again with `Last-Event-ID` when the connection drops, until a terminal event, a clean end, or
a deadline.

Outcomes: completed / failed / cancelled / interrupted (the terminal event), rejected (429/503 at
the door), refused (no gateway to connect to), closed (the stream ended without a terminal event
and the server no longer knows the turn), hung (none of those before the deadline).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

TERMINAL = {"turn.completed": "completed", "turn.failed": "failed", "turn.cancelled": "cancelled",
            "turn.interrupted": "interrupted"}


@dataclass
class TurnOutcome:
    session: str
    outcome: str = "hung"
    turn_id: str | None = None
    text: str = ""
    last_id: int = 0
    resumes: int = 0
    status: int = 0
    seconds: float = 0.0
    error: str = ""            # a failed turn's error code (its `turn.failed` event's)
    ids: list[int] = field(default_factory=list)

    @property
    def gapless(self) -> bool:
        """Every event id once, in order, across the first stream and its resumes."""
        return self.ids == list(range(self.ids[0], self.ids[0] + len(self.ids))) if self.ids else True


def sse_field(line: str) -> tuple[str, str]:
    """One non-empty SSE line as (field, value); a comment (keep-alive) is ("", "")."""
    if line.startswith(":"):
        return "", ""
    name, _, value = line.partition(":")
    return name, value[1:] if value.startswith(" ") else value


async def sse_events(resp: aiohttp.ClientResponse):
    """The events of an SSE body as (event, decoded JSON data, id or None); events without data
    (keep-alives) are skipped. The one SSE parser of the benchmarks and the tests."""
    event, data, ident = "message", [], None
    async for raw in resp.content:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if line:
            name, value = sse_field(line)
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                ident = int(value)
            continue
        if data:
            yield event, json.loads("\n".join(data)), ident
        event, data, ident = "message", [], None


async def read_events(resp: aiohttp.ClientResponse, into: TurnOutcome, stop_after: int | None = None) -> str | None:
    """Consume an SSE body into `into`; the terminal event's outcome, or None if it ended without one.
    With `stop_after`, return None after that many events (the client walks away)."""
    seen = 0
    async for event, body, ident in sse_events(resp):
        if ident is not None and ident > into.last_id:
            into.last_id = ident
            into.ids.append(ident)
            if event == "turn.started":
                into.turn_id = body.get("turn_id")
            elif event == "delta":
                into.text += body.get("text", "")
            elif event in TERMINAL:
                if event == "turn.failed":
                    into.error = (body.get("error") or {}).get("code", "")
                return TERMINAL[event]
        seen += 1
        if stop_after is not None and seen >= stop_after:
            return None
    return None


async def run_turn(http: aiohttp.ClientSession, base: str, session: str, text: str, deadline_secs: float,
                   retry_secs: float = 0.5) -> TurnOutcome:
    """One turn to its end, resuming after dropped connections; never longer than the deadline."""
    out = TurnOutcome(session)
    started = time.monotonic()
    try:
        await asyncio.wait_for(_follow(http, base, session, text, out, retry_secs), deadline_secs)
    except asyncio.TimeoutError:
        out.outcome = "hung"
    out.seconds = time.monotonic() - started
    return out


async def _follow(http, base, session, text, out: TurnOutcome, retry_secs: float) -> None:
    try:
        async with http.post(f"{base}/v1/sessions/{session}/turns", json={"input": text}) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.outcome = "rejected" if resp.status in (429, 503) else f"http_{resp.status}"
                return
            ended = await read_events(resp, out)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.IncompleteReadError):
        ended = None
        if out.status == 0:
            out.outcome = "refused"
            return
    while ended is None:
        if out.turn_id is None:   # dropped before the turn was named: nothing to pick up
            out.outcome = "closed"
            return
        await asyncio.sleep(retry_secs)
        out.resumes += 1
        try:
            async with http.get(f"{base}/v1/sessions/{session}/turns/{out.turn_id}/events",
                                headers={"Last-Event-ID": str(out.last_id)}) as resp:
                if resp.status == 404:       # the turn is gone: its stream ended cleanly, unfinished
                    out.outcome = "closed"
                    return
                if resp.status != 200:       # e.g. 503 while its actor restarts: try again
                    continue
                ended = await read_events(resp, out)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.IncompleteReadError):
            continue
    out.outcome = ended
