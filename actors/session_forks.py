"""A session forked from another: a new session that begins with the first messages of a
session's transcript, so a conversation can branch there (as opencode's `POST /session/:id/fork`)
while the original goes on untouched.

The new session's actor makes it, in one full checkpoint (seq 1), which is how any session's
history is kept: its transcript (`GET .../messages`) and its next turn's load read it like any
other, and a fork that failed wrote nothing. The source is read from writer/store as of every
checkpoint acknowledged before (its actor may be another; a turn it runs now has checkpointed
what it did so far). A fork goes only into a session with no history and no running turn, and
the new session's turns wait while it is made (actors/closing.py), so none starts on an empty
history that the fork then overwrites.

A cut must not part a tool call from its results: the model would be sent an assistant message
with `tool_calls` and no answer to them, which OpenAI-compatible providers refuse.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.persistence import StorageUnavailable
from broker.protocol import Kind, Message, past_deadline
from storage.log_client import LogWriteError
from storage.records import RecordKind

if TYPE_CHECKING:
    from actors.actor_process import Actor


def clean_cut(messages: list[dict[str, Any]], count: int) -> bool:
    """Whether the first `count` messages end with every tool call answered."""
    if count < len(messages) and messages[count].get("role") == "tool":
        return False
    answered, at = 0, count - 1
    while at >= 0 and messages[at].get("role") == "tool":
        answered, at = answered + 1, at - 1
    calls = messages[at].get("tool_calls") if at >= 0 and messages[at].get("role") == "assistant" else None
    return not calls or answered >= len(calls)


def fork_count(messages: list[dict[str, Any]], wanted: int | None) -> int:
    """How many messages the fork begins with; ValueError (its message for the client) if it
    cannot begin with `wanted`. None: all of them, less an unanswered tool call at the end."""
    if wanted is None:
        count = len(messages)
        while count > 0 and not clean_cut(messages, count):
            count -= 1
        if count == 0:
            raise ValueError("the session has no message a fork could begin with")
        return count
    if not 1 <= wanted <= len(messages):
        raise ValueError(f"the session has {len(messages)} messages: a fork begins with 1 to {len(messages)}")
    if not clean_cut(messages, wanted):
        raise ValueError(f"the first {wanted} messages part a tool call from its results: fork before the "
                         "assistant message that made the call, or after its last result")
    return wanted


class SessionForks:
    def __init__(self, actor: "Actor") -> None:
        self.actor = actor

    async def on_fork(self, msg: Message) -> None:
        if past_deadline(msg.body, time.time()):
            return   # its gateway answered 503 (this actor was stalled): the client may ask again
        sid = msg.body["session"]
        hold = self.actor.closing.hold(sid)   # before any await: a turn start after this one waits
        try:
            reply = await self._fork(msg.body)
        except LogWriteError as exc:
            reply = {"ok": False, "code": exc.code, "error": f"session not forked: {exc}"}
        except StorageUnavailable as exc:
            reply = {"ok": False, "code": "unavailable", "error": f"session not forked: {exc}"}
        finally:
            self.actor.closing.release(sid, hold)
        self.actor.bus.reply(msg, Kind.SESSION_FORKED, reply)

    async def _fork(self, b: dict[str, Any]) -> dict[str, Any]:
        sid, source = b["session"], b["source"]
        if sid == source:
            return {"ok": False, "code": "session_exists", "error": "a session is not forked into itself"}
        session = self.actor.sessions.get(sid)
        if session is not None and session.active is not None and not session.active.ended:
            return {"ok": False, "code": "session_exists", "error": "the new session has a turn running"}
        persistence = self.actor.persistence
        if (await persistence.history(sid))[1]:
            return {"ok": False, "code": "session_exists",
                    "error": "the new session has a history: fork into a session id with none"}
        messages, _ = await persistence.history(source)
        if not messages:
            return {"ok": False, "code": "not_found", "error": "no such session, or it has no messages"}
        try:
            count = fork_count(messages, b.get("messages"))
        except ValueError as exc:
            return {"ok": False, "code": "invalid_cut", "error": str(exc)}
        await persistence.log.append(RecordKind.CHECKPOINT, {
            "session": sid, "tenant": b["tenant"], "turn": "", "seq": 1, "full": True, "first": 0, "new_from": 0,
            "messages": messages[:count], "at": time.time(), "forked_from": source}, sid, sync=True)
        self.actor.sessions.drop(sid)   # its next turn loads it from its checkpoint
        return {"ok": True, "messages": count}
