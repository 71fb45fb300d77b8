"""What a client asks of a running turn, each sent to its session's actor:
`DELETE /v1/sessions/{sid}/turns/current` cancels it, and
`POST /v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}` answers a tool call it waits on
before running it (actors/tool_approvals.py; the actor journals the answer before it replies)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.client import BusError
from broker.protocol import Kind
from broker.sharding import actor_name
from gateway.errors import LOG_WRITE_ERRORS, ApiError, json_response

if TYPE_CHECKING:
    from gateway.app import Gateway

APPROVAL_ROUTE = "/v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}"
STATUS_OF = {**LOG_WRITE_ERRORS, "not_found": (404, "not_found"), "not_waiting": (409, "not_waiting")}
MAX_REASON = 2000


async def cancel_turn(gw: "Gateway", request: web.Request) -> web.Response:
    _, sid, _ = gw.session_of(request)
    try:
        status = await gw.bus.request(actor_name(sid, gw.shards), Kind.TURN_CANCEL,
                                      {"session": sid, "reason": "client_cancel"}, timeout=5.0, session=sid)
    except BusError as exc:
        raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}") from None
    if status.body["state"] != "cancelled":
        raise ApiError(404, "no_active_turn", "no turn is running on this session")
    return json_response({"cancelled": True, "turn_id": status.body["turn_id"]})


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
