"""One operation of a flow run (a step, sleep, wait, child, send, attribute write or patch mark)
as the run's journal has it (actors/flow_state.py applies the records)."""
from __future__ import annotations

from typing import Any


class Op:
    __slots__ = ("seq", "op", "name", "attempts", "interrupted", "interrupted_last", "done", "ok", "result", "error",
                 "heartbeat", "due", "channel", "channels", "child", "started_at", "ended_at")

    def __init__(self, seq: int, op: str, name: str) -> None:
        self.seq = seq
        self.op = op
        self.name = name
        self.attempts = 0
        self.interrupted = 0        # attempts its workers' clean stops cut short: they do not count
        self.interrupted_last = 0   # the last of them (each is counted once)
        self.done = False
        self.ok = True
        self.result: Any = None
        self.error = ""
        self.heartbeat: Any = None
        self.due = 0.0
        self.channel = ""
        self.channels: tuple[str, ...] = ()   # a wait for the first message on any of these (ctx.wait_any)
        self.child = ""
        self.started_at = 0.0   # its first record's time, and its outcome's (GET /v1/runs/{id}/steps)
        self.ended_at = 0.0

    def view(self, run_ended: bool) -> dict[str, Any]:
        """What a client is shown of it (GET /v1/runs/{id}/steps): `status` is completed or
        failed once done, else running (a step) or waiting (a sleep, a wait, a child), or
        abandoned if the run ended without it."""
        status = ("completed" if self.ok else "failed") if self.done else "abandoned" if run_ended else \
            "running" if self.op == "step" else "waiting"
        out: dict[str, Any] = {"seq": self.seq, "op": self.op, "name": self.name, "status": status,
                               "started_at": self.started_at, "ended_at": self.ended_at if self.done else None}
        if self.op == "step":
            out["attempts"] = self.attempts
            if self.interrupted:
                out["interrupted"] = self.interrupted
        if self.done and self.ok:
            out["result"] = self.result
        elif self.error:   # a failed outcome, or the last failed attempt of a step still retried
            out["error"] = self.error
        out.update(self.what_for())
        if self.heartbeat is not None:
            out["heartbeat"] = self.heartbeat
        return out

    def what_for(self) -> dict[str, Any]:
        """Its child, channel(s) and due time, those it has."""
        out = {field: getattr(self, field) for field in ("child", "channel", "due") if getattr(self, field)}
        if self.channels:
            out["channels"] = list(self.channels)
        return out

    def listens_to(self, channel: str) -> bool:
        """Whether a message published to `channel` is this wait's."""
        return channel in self.channels if self.channels else channel == self.channel

    def outcome(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "op": self.op, "name": self.name, "ok": self.ok}
        if self.ok:
            out["result"] = self.result
        else:
            out["error"] = self.error
        return out
