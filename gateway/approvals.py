"""`POST /v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}`: a person's answer for a tool call
a turn waits on before running it (actors/tool_approvals.py), sent to the session's actor, which
journals it before it answers."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.client import BusError
from broker.protocol import Kind
from broker.sharding import actor_name
from gateway.errors import LOG_WRITE_ERRORS, ApiError, json_response

if TYPE_CHECKING:
    from gateway.app import Gateway

ROUTE = "/v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}"
STATUS_OF = {**LOG_WRITE_ERRORS, "not_found": (404, "not_found"), "not_waiting": (409, "not_waiting")}
MAX_REASON = 2000


async def answer_approval(gw: "Gateway", request: web.Request) -> web.Response:
    tenant, sid, _ = gw.session_of(request)
    turn_id, call_id = request.match_info["turn_id"], request.match_info["call_id"]
    body = await gw.json_body(request)
    unknown = sorted(set(body) - {"approve", "reason"})
    if unknown:
        raise ApiError(400, "invalid_body", f"unknown field(s) {', '.join(map(repr, unknown))}: the body is "
                                            '{"approve": true or false, "reason": ...}')
    approve, reason = body.get("approve"), body.get("reason", "")
    if not isinstance(approve, bool) or not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ApiError(400, "invalid_body", f'"approve" is true or false; "reason", if any, a string of at most '
                                            f"{MAX_REASON} characters")
    if len(turn_id) > 200 or len(call_id) > 200:
        raise ApiError(404, "not_found", "no such turn or call")
    try:
        reply = await gw.bus.request(actor_name(sid, gw.shards), Kind.TURN_APPROVE,
                                     {"session": sid, "turn_id": turn_id, "call_id": call_id, "approve": approve,
                                      "reason": reason}, timeout=10.0, session=sid)
    except BusError as exc:
        raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}") from None
    code = reply.body.get("code")
    if code:
        status, code = STATUS_OF.get(code, (502, code))
        raise ApiError(status, code, reply.body.get("error") or code)
    return json_response({"turn_id": turn_id, "call_id": call_id, "approved": approve})
