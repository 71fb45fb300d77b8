"""What of a session's history a model call is sent (`provider.max_context_chars`).

A session's transcript only grows, and a model's context does not: a long-lived session would
one day be refused by the provider on every turn. So a call may be sent only the newest messages
whose characters (as JSON: content, tool calls and results alike; about four a token in English)
fit the budget. The transcript itself keeps everything; only the request is windowed.

The current turn — from its user message on, its tool calls and results included — is always
sent whole, whatever it takes: the model cannot answer without it. Older messages are added
newest first while they fit, and the window begins at a user message: whole exchanges, never an
answer without its question nor a tool result whose call was left out (OpenAI-compatible
providers refuse a result with no call before it). For the same reason a tool call the history
keeps without its answer (written before a turn cut short answered its calls) is sent with one,
and an answer that came after the next question is left out.
"""
from __future__ import annotations

from typing import Any

import orjson


def _chars(message: dict[str, Any]) -> int:
    return len(orjson.dumps(message))


def context(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The messages a model call is sent: all of them, or (max_chars > 0) the current turn and the
    newest older ones that fit."""
    if max_chars <= 0 or not messages:
        return messages
    start = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0)
    turn_start = start
    total = sum(_chars(m) for m in messages[start:])
    while start > 0:
        size = _chars(messages[start - 1])
        if total + size > max_chars:
            break
        start, total = start - 1, total + size
    while start < turn_start and messages[start].get("role") != "user":
        start += 1
    return messages[start:] if start else messages


UNANSWERED = '{"error": "not finished: the turn was cut short before this call\'s result came"}'


def answered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with an answer for each tool call left without one, and without answers to
    no call waiting. A turn cut short answers its unfinished calls itself, before the turn that
    superseded it begins (actors/agent_loop.py, actors/actor_process.py); a history written
    before it did so keeps such calls, or their answers after the next question, and a provider
    refuses every request that carries one."""
    out: list[dict[str, Any]] = []
    waiting: list[str] = []
    added = False
    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in waiting:
                added = True   # an answer to no call waiting: left out
                continue
            waiting.remove(message["tool_call_id"])
        else:
            added = added or bool(waiting)
            out.extend({"role": "tool", "tool_call_id": call_id, "content": UNANSWERED} for call_id in waiting)
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            waiting = [c["id"] for c in calls if isinstance(c, dict) and "id" in c] if isinstance(calls, list) else []
        out.append(message)
    if waiting:
        out.extend({"role": "tool", "tool_call_id": call_id, "content": UNANSWERED} for call_id in waiting)
        added = True
    return out if added else messages
