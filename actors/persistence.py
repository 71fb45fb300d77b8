"""What an actor makes durable, and how it reads it back.

- After every step the session is checkpointed: the messages added since its previous
  checkpoint, or all of them every `storage.snapshot_every` checkpoints, so a write costs the
  delta, not the whole history. The checkpoint is SYNC: the turn moves on once it is durable.
- Turn events (started, step completed, ended) are ASYNC records.
- A session is loaded from its latest checkpoint chain (the last full snapshot and the deltas
  after it) with a `sync` store query, so it sees every checkpoint acknowledged before.
- External runtimes' checkpoints (blobs under a key) never pass through an actor: the gateway
  writes them (SYNC) and serves the latest (gateway/latest_checkpoints.py).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from agentos.config import Config
from actors.session import Session
from actors.turn import Turn
from broker.client import Bus, BusError
from broker.protocol import Kind
from broker.sharding import STORE
from storage.log_client import LogClient
from storage.records import RecordKind

LOAD_TIMEOUT_SECS = 30.0


class StorageUnavailable(RuntimeError):
    pass


class Persistence:
    def __init__(self, bus: Bus, config: Config) -> None:
        self.bus = bus
        self.log = LogClient(bus, config.storage.log_writers)
        self.snapshot_every = config.storage.snapshot_every
        self.durability = config.storage.durability

    async def query(self, name: str, session: str, **params: Any) -> dict:
        try:
            reply = await self.bus.request(STORE, Kind.STORE_QUERY, {"query": name, "session": session, **params},
                                           timeout=LOAD_TIMEOUT_SECS, attempt_secs=LOAD_TIMEOUT_SECS / 3,
                                           session=session)
        except BusError as exc:
            raise StorageUnavailable(f"the store did not answer: {exc}") from None
        if reply.body.get("error"):
            raise StorageUnavailable(reply.body["error"])
        return reply.body

    async def ensure_loaded(self, session: Session) -> None:
        """Load the session's messages once; concurrent callers wait for the same load."""
        if session.loading is None:
            session.loading = asyncio.get_running_loop().create_future()
            try:
                await self._load(session)
            except BaseException as exc:
                fut, session.loading = session.loading, None
                fut.set_exception(exc if isinstance(exc, Exception) else StorageUnavailable("load cancelled"))
                fut.exception()  # retrieved: the caller re-raises it
                raise
            session.loading.set_result(None)
            return
        await asyncio.shield(session.loading)

    async def history(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The session's messages as its latest checkpoint chain has them, and that chain's rows."""
        rows = (await self.query("checkpoint_chain", session_id, sync=True))["rows"]
        messages: list[dict[str, Any]] = []
        for row in rows:
            first = row["first"]
            messages[first:] = row["messages"]
        return messages, rows

    async def _load(self, session: Session) -> None:
        messages, rows = await self.history(session.id)
        if rows:
            session.messages = messages + session.messages[len(messages):] if session.messages else messages
            session.checkpoint_seq = rows[-1]["seq"]
            session.checkpointed = len(messages)
            session.since_full = len(rows) - 1

    async def checkpoint(self, session: Session, turn: Turn) -> None:
        """Make the session's new messages durable (SYNC)."""
        if session.checkpointed >= len(session.messages):
            return
        session.checkpoint_seq += 1
        full = session.checkpoint_seq == 1 or session.since_full + 1 >= self.snapshot_every
        first = 0 if full else session.checkpointed
        body = {"session": session.id, "tenant": session.tenant, "turn": turn.turn_id, "seq": session.checkpoint_seq,
                "full": full, "first": first, "new_from": session.checkpointed,
                "messages": session.messages[first:], "at": time.time()}
        session.checkpointed = len(session.messages)
        session.since_full = 0 if full else session.since_full + 1
        await self.log.append(RecordKind.CHECKPOINT, body, session.id, sync=True)

    def event_nowait(self, turn: Turn, kind: str, data: dict[str, Any] | None = None) -> None:
        """An ASYNC turn event; it goes out in this loop iteration's batch."""
        self.log.append_nowait(RecordKind.EVENT, {"session": turn.session_id, "tenant": turn.tenant,
                                                  "turn": turn.turn_id, "seq": turn.seq, "type": kind,
                                                  "data": data, "at": time.time()}, turn.session_id)

