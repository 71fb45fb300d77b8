"""Records to rows: how each kind of log record lands in the DuckDB tables (see schema.py)."""
from __future__ import annotations

from typing import Any, Iterator

import msgpack
import orjson

from storage.records import RecordKind

Row = tuple[Any, ...]
_pack = msgpack.Packer(use_bin_type=True).pack
_MESSAGE_FIELDS = ("role", "content")


def _json(value: Any) -> str | None:
    return orjson.dumps(value).decode() if value is not None else None


def project(kind: int, body: dict[str, Any], writer: int, lsn: int) -> Iterator[tuple[str, Row]]:
    """(table, row) pairs for one record."""
    session = body.get("session", "")
    tenant = body.get("tenant", "")
    at = float(body.get("at", 0.0))
    if kind == RecordKind.EVENT:
        yield "events", (session, tenant, body.get("turn", ""), int(body.get("seq", 0)), body.get("type", ""),
                         _json(body.get("data")), at, writer, lsn)
    elif kind == RecordKind.CHECKPOINT:
        messages = body.get("messages") or []
        first = int(body.get("first", 0))
        new_from = int(body.get("new_from", first))
        yield "checkpoints", (session, tenant, "agent", "", int(body["seq"]), bool(body.get("full")), first,
                              _pack(messages), at, writer, lsn)
        turn = body.get("turn", "")
        for offset, message in enumerate(messages):
            idx = first + offset
            if idx < new_from:
                continue  # already projected from an earlier checkpoint (this one is a full snapshot)
            extra = {k: v for k, v in message.items() if k not in _MESSAGE_FIELDS} or None
            content = message.get("content")
            yield "messages", (session, tenant, idx, turn, message.get("role", ""),
                               content if isinstance(content, str) else _json(content), _json(extra), at, writer, lsn)
    elif kind == RecordKind.BLOB:
        yield "checkpoints", (session, tenant, "blob", body.get("key", ""), int(body["seq"]), True, 0,
                              bytes(body.get("payload", b"")), at, writer, lsn)
    elif kind == RecordKind.FLOW:
        yield "flow_records", (body.get("run", ""), tenant, body.get("type", ""), int(body.get("seq", -1)),
                               _pack(body), at, writer, lsn)
    elif kind == RecordKind.CLOSE:
        if not session or not isinstance(session, str):   # '' names the progress rows
            raise ValueError("a CLOSE record must name a session")
        upto = [[int(log), int(position)] for log, position in body.get("upto") or []]
        yield "closed_sessions", (session, tenant, _json(upto), at, False, writer, lsn)
    elif kind == RecordKind.ACCESS:
        if "rows" in body:   # many requests: [at, method, route, status, tenant, session, duration_ms] each
            for r_at, method, route, status, r_tenant, r_session, duration_ms in body["rows"]:
                yield "access", (float(r_at), method, route, int(status), r_tenant, r_session, float(duration_ms),
                                 writer, lsn)
        else:                # one request per record, as logs written before 2026-12-01 hold them
            yield "access", (at, body.get("method", ""), body.get("route", ""), int(body.get("status", 0)), tenant,
                             session, float(body.get("duration_ms", 0.0)), writer, lsn)
