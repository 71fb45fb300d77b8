"""One turn as its actor sees it: its events, numbered and kept for replay.

Every event goes to the gateway that started the turn as a bus message carrying its sequence
number, and stays in the turn's buffer until the turn has been finished for a retention window.
A gateway that missed events (a lost message, a broker restart, a gateway restart) asks for a
replay from the last number it has, so a stream never skips or repeats an event.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from broker.client import Bus
from broker.protocol import TURN_TERMINAL, Kind

MAX_EVENTS_PER_TURN = 4096
OUTCOMES = {Kind.TURN_DONE: "completed", Kind.TURN_FAILED: "failed", Kind.TURN_CANCELLED: "cancelled"}


class Turn:
    __slots__ = ("turn_id", "session_id", "tenant", "input", "gateway", "bus", "events", "seq", "task",
                 "cancel_reason", "started_at", "first_token_at", "ended_at", "_pending_text", "_flush_scheduled",
                 "outcome", "delta_window", "_last_flush", "replay_pos", "resumed", "pending_cancel", "running",
                 "system", "approvals", "stream")

    def __init__(self, bus: Bus, turn_id: str, session_id: str, tenant: str, text: str, gateway: str,
                 delta_window_secs: float = 0.0) -> None:
        self.bus = bus
        self.turn_id = turn_id
        self.session_id = session_id
        self.tenant = tenant
        self.input = text
        self.gateway = gateway
        self.events: list[tuple[Kind, dict[str, Any]]] = []
        self.seq = 0
        self.task: asyncio.Task | None = None
        self.cancel_reason = ""
        self.started_at = time.monotonic()
        self.first_token_at = 0.0
        self.ended_at = 0.0
        self.outcome = ""
        self._pending_text: list[str] = []
        self._flush_scheduled = False
        self.delta_window = delta_window_secs
        self._last_flush = 0.0
        self.replay_pos: int | None = None   # while a resumed turn replays its journal
        self.resumed = False                 # finishing after a restart, with nobody streaming it
        self.pending_cancel: asyncio.TimerHandle | None = None   # a disconnect's cancel, in its grace
        self.running = False                 # its task has taken its first step (see cancel)
        self.system: str | None = None       # its own instructions, in place of provider.system_prompt
        self.approvals: dict = {}            # call id -> a tool call waiting for a person (actors/tool_approvals.py)
        self.stream = ""                     # the gateway stream that now reads it: a cancel from an older one is stale

    @property
    def ended(self) -> bool:
        return self.ended_at > 0.0

    def record(self, kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
        """Number and keep an event without sending it (the started event goes out as a reply)."""
        self.seq += 1
        body["turn_id"] = self.turn_id
        body["seq"] = self.seq
        if len(self.events) < MAX_EVENTS_PER_TURN or kind in TURN_TERMINAL:
            self.events.append((kind, body))
        return body

    def emit(self, kind: Kind, body: dict[str, Any]) -> None:
        if self.ended:
            return
        if self._pending_text:
            self._flush_text()
        body = self.record(kind, body)
        if self.gateway:
            self.bus.send(self.gateway, kind, body, session=self.session_id, turn=self.turn_id)
        if kind in TURN_TERMINAL:
            self.ended_at = time.monotonic()
            self.outcome = OUTCOMES[kind]

    def delta(self, text: str) -> None:
        """Queue text. The first delta goes out at once; later ones are merged per delta window."""
        now = time.monotonic()
        if not self.first_token_at:
            self.first_token_at = now
        self._pending_text.append(text)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            wait = self._last_flush + self.delta_window - now if self._last_flush else 0.0
            loop = asyncio.get_running_loop()
            if wait > 0:
                loop.call_later(wait, self._flush_text)
            else:
                loop.call_soon(self._flush_text)

    def _flush_text(self) -> None:
        self._flush_scheduled = False
        if not self._pending_text or self.ended:
            return
        self._last_flush = time.monotonic()
        text = "".join(self._pending_text)
        self._pending_text.clear()
        body = self.record(Kind.TURN_DELTA, {"text": text})
        if self.gateway:
            self.bus.send(self.gateway, Kind.TURN_DELTA, body, session=self.session_id, turn=self.turn_id)

    def replay(self, after: int, gateway: str) -> None:
        """Send again every event numbered above `after`, to the gateway that now holds the stream."""
        self.gateway = gateway
        for kind, body in self.events:
            if body["seq"] > after:
                self.bus.send(gateway, kind, body, session=self.session_id, turn=self.turn_id)

    def cancel(self, reason: str) -> bool:
        if self.ended or self.task is None or self.task.done():
            return False
        self.cancel_reason = reason
        # A task cancelled before its first step never enters its coroutine, so it would end
        # with no event and no bookkeeping; one not yet running sees the reason when it starts.
        if self.running:
            self.task.cancel()
        return True


async def ended_first(before: asyncio.Task, secs: float) -> bool:
    """Wait (up to `secs`) for the task of the turn a new one superseded to end; False if it did
    not. The old turn answers the tool calls it cut in the session's history, and the new turn's
    question must come after those answers (a provider refuses a history with a call unanswered,
    or an answer after a question). A cancel meanwhile waits too, and is raised after: so a turn
    superseded in its turn ends after the one it superseded."""
    deadline = time.monotonic() + secs
    cancelled = False
    while not before.done() and time.monotonic() < deadline:
        try:
            await asyncio.wait([before], timeout=deadline - time.monotonic())
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return before.done()
