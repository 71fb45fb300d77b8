"""Sessions resident in an actor: message history, the one active turn, checkpoint state.

A session is loaded once from its latest checkpoint chain (its messages) and then lives in
memory until it has been idle for `kernel.session_ttl_secs`; its durable history stays in the
log and DuckDB, so an evicted session comes back whole on its next use.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.turn import Turn


class Session:
    __slots__ = ("id", "tenant", "messages", "active", "last_used", "loading", "checkpoint_seq", "checkpointed",
                 "since_full")

    def __init__(self, session_id: str, tenant: str) -> None:
        self.id = session_id
        self.tenant = tenant
        self.messages: list[dict[str, Any]] = []
        self.active: Turn | None = None
        self.last_used = time.monotonic()
        self.loading: asyncio.Future | None = None   # done once the history is in memory
        self.checkpoint_seq = 0      # seq of the last agent checkpoint written
        self.checkpointed = 0        # messages[:checkpointed] are in a checkpoint
        self.since_full = 0          # checkpoints since the last full snapshot


class SessionTable:
    def __init__(self, ttl_secs: float) -> None:
        self.ttl_secs = ttl_secs
        self.sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def open(self, session_id: str, tenant: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = Session(session_id, tenant)
        session.last_used = time.monotonic()
        return session

    def drop(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def evict_idle(self, now: float) -> int:
        idle = [sid for sid, s in self.sessions.items()
                if s.active is None and now - s.last_used > self.ttl_secs]
        for sid in idle:
            del self.sessions[sid]
        return len(idle)
