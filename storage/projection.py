"""Records to rows: how each kind of log record lands in the DuckDB tables (see schema.py)."""
from __future__ import annotations

from typing import Any, Iterator

import msgpack
import orjson

from storage.records import RecordKind

Row = tuple[Any, ...]
_pack = msgpack.Packer(use_bin_type=True).pack
_MESSAGE_FIELDS = ("role", "content")
LISTED_EXTRA = ("queue", "queue_key", "schedule", "forked_from")   # a run's start fields its listing names (`extra`)
# and those that are positive numbers: a delayed start's time (the listing says `scheduled`), a
# queued run's priority (0, the default, is not recorded)
LISTED_NUMBERS = ("start_at", "priority")


def _json(value: Any) -> str | None:
    return orjson.dumps(value).decode() if value is not None else None


# What a column takes, checked here: a value DuckDB refuses at the commit fails the whole batch,
# again at every retry, and the loader stops behind it (a peer's record with a seq of 2**31 did);
# refused here, it fails its own record alone, which the loader skips and counts.
def _i32(value: Any) -> int:
    value = int(value)
    if not -(1 << 31) <= value < 1 << 31:
        raise ValueError(f"{value} does not fit an INTEGER column")
    return value


def _i64(value: Any) -> int:
    value = int(value)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{value} does not fit a BIGINT column")
    return value


def _text(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise TypeError(f"a text column given {type(value).__name__}")
    return value


def _listed(start: dict[str, Any]) -> dict[str, Any]:
    """What a run's start gives its listing beside its flow and parent (junk is left out: the
    record is a peer's, and its listing is no reason to refuse it)."""
    out: dict[str, Any] = {f: start[f] for f in LISTED_EXTRA if type(start.get(f)) is str and start[f]}
    out.update((f, start[f]) for f in LISTED_NUMBERS
               if type(start.get(f)) in (int, float) and 0 < start[f] < 1e12)   # finite, JSON-safe
    return out


def _blob(value: Any) -> bytes:
    if type(value) is not bytes:   # bytes(n) of an int would make n zero bytes
        raise TypeError(f"a blob column given {type(value).__name__}")
    return value


def project(kind: int, body: dict[str, Any], writer: int, lsn: int) -> Iterator[tuple[str, Row]]:
    """(table, row) pairs for one record."""
    session = _text(body.get("session", ""))
    tenant = _text(body.get("tenant", ""))
    at = float(body.get("at", 0.0))
    if kind == RecordKind.EVENT:
        yield "events", (session, tenant, _text(body.get("turn", "")), _i32(body.get("seq", 0)),
                         _text(body.get("type", "")), _json(body.get("data")), at, writer, lsn)
    elif kind == RecordKind.CHECKPOINT:
        messages = body.get("messages") or []
        first = _i32(body.get("first", 0))
        new_from = int(body.get("new_from", first))
        yield "checkpoints", (session, tenant, "agent", "", _i64(body["seq"]), bool(body.get("full")), first,
                              _pack(messages), at, writer, lsn)
        turn = _text(body.get("turn", ""))
        for offset, message in enumerate(messages):
            idx = _i32(first + offset)
            if idx < new_from:
                continue  # already projected from an earlier checkpoint (this one is a full snapshot)
            extra = {k: v for k, v in message.items() if k not in _MESSAGE_FIELDS} or None
            content = message.get("content")
            yield "messages", (session, tenant, idx, turn, _text(message.get("role", "")),
                               content if isinstance(content, str) else _json(content), _json(extra), at, writer, lsn)
    elif kind == RecordKind.BLOB:
        yield "checkpoints", (session, tenant, "blob", _text(body.get("key", "")), _i64(body["seq"]), True, 0,
                              _blob(body.get("payload", b"")), at, writer, lsn)
    elif kind == RecordKind.FLOW:
        kind_of = _text(body.get("type", ""))
        # for the listing of runs (storage/run_queries.py q_runs); never a reason to refuse the record
        name = body.get("flow") if kind_of == "run.started" else body.get("status") if kind_of == "run.ended" else None
        parent = body.get("parent") if kind_of == "run.started" else None
        extra = _listed(body) if kind_of == "run.started" else None
        yield "flow_records", (_text(body.get("run", "")), tenant, kind_of, _i32(body.get("seq", -1)), _pack(body),
                               at, writer, lsn, name if type(name) is str else None,
                               parent if type(parent) is str and parent else None, _json(extra or None))
    elif kind == RecordKind.CLOSE:
        if not session or not isinstance(session, str):   # '' names the progress rows
            raise ValueError("a CLOSE record must name a session")
        upto = [[int(log), int(position)] for log, position in body.get("upto") or []]
        yield "closed_sessions", (session, tenant, _json(upto), at, False, writer, lsn)
    elif kind == RecordKind.ACCESS:
        if "rows" in body:   # many requests: [at, method, route, status, tenant, session, duration_ms] each
            for r_at, method, route, status, r_tenant, r_session, duration_ms in body["rows"]:
                yield "access", (float(r_at), _text(method), _text(route), _i32(status), _text(r_tenant),
                                 _text(r_session), float(duration_ms), writer, lsn)
        else:                # one request per record, as logs written before 2026-12-01 hold them
            yield "access", (at, _text(body.get("method", "")), _text(body.get("route", "")),
                             _i32(body.get("status", 0)), tenant, session, float(body.get("duration_ms", 0.0)),
                             writer, lsn)
