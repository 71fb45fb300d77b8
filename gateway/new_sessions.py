"""Sessions made by request: `POST /v1/sessions` (a fresh id; sessions also come into being with
their first turn) and `POST /v1/sessions/{sid}/fork` (a new session that begins with the first
messages of this one: actors/session_forks.py makes it, on the new session's actor)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web

from broker.client import BusError
from broker.protocol import Kind
from broker.sharding import actor_name
from gateway.errors import LOG_WRITE_ERRORS, ApiError, json_response
from gateway.tenancy import check_session_id, internal, new_session_id

if TYPE_CHECKING:
    from gateway.app import Gateway

FORK_SECS = 30.0
STATUS_OF = {**LOG_WRITE_ERRORS, "not_found": (404, "not_found"), "session_exists": (409, "session_exists"),
             "invalid_cut": (409, "invalid_cut"), "unavailable": (503, "storage_unavailable")}


async def new_session(gw: "Gateway", request: web.Request) -> web.Response:
    gw.tenant_of(request)
    return json_response({"session_id": new_session_id()}, status=201)


async def fork_session(gw: "Gateway", request: web.Request) -> web.Response:
    tenant, source, external_source = gw.session_of(request)
    body = await gw.json_body(request) if request.can_read_body else {}
    unknown = sorted(set(body) - {"session_id", "messages"})
    if unknown:
        raise ApiError(400, "invalid_body", f"unknown field(s) {', '.join(map(repr, unknown))}: the body is "
                                            '{"session_id": ..., "messages": ...}')
    new = body.get("session_id")
    if new is None:
        new = new_session_id()
    elif not isinstance(new, str):
        raise ApiError(400, "invalid_session_id", "session_id must be a string")
    check_session_id(new)
    count = body.get("messages")
    if count is not None and (type(count) is not int or not 1 <= count < 2**31):
        raise ApiError(400, "invalid_parameter", "messages must be how many of the session's first messages the "
                                                 "fork begins with: an integer >= 1")
    sid = internal(tenant, new)
    try:
        reply = await gw.bus.request(actor_name(sid, gw.shards), Kind.SESSION_FORK, {
            "session": sid, "tenant": tenant, "source": source, "messages": count,
            "deadline": time.time() + FORK_SECS}, timeout=FORK_SECS, session=sid)
    except BusError as exc:
        raise ApiError(503, "actor_unavailable", f"the new session's actor did not answer: {exc}") from None
    if not reply.body["ok"]:
        status, code = STATUS_OF.get(reply.body.get("code", ""), (503, "storage_error"))
        raise ApiError(status, code, reply.body.get("error") or code)
    return json_response({"session_id": new, "forked_from": external_source, "messages": reply.body["messages"]},
                         status=201)
