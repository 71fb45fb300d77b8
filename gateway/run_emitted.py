"""`GET /v1/runs/{id}/emitted`: the values a flow run emitted (`ctx.emit`), a page at a time by
seq, or followed as server-sent events until the run ends (`Accept: text/event-stream`).

Each value is durable in the run's journal before its reader sees it, and keeps its seq (the
run's operation it is): a reader that lost its stream asks again after the last seq it had
(`Last-Event-ID` or `?after`), and gets each value once, in order. The stream ends with a
`run.ended` event: the run's status and its result or error.
"""
from __future__ import annotations

import orjson
from aiohttp import web

from actors.flow_client import FlowError
from actors.flow_state import TERMINAL
from gateway.errors import ApiError, int_param, json_response
from gateway.flows import FlowRoutes, _error
from gateway.streams import render, sse_response

FOLLOW_SECS = 15.0   # each ask of a followed stream waits this long for a value, then a keep-alive goes out
MAX_WAIT_SECS = 60


def _after(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return int_param(request, "after", -1, -1, 2**31)
    try:
        after = int(raw)
    except ValueError:
        raise ApiError(400, "invalid_parameter", "Last-Event-ID must be the seq of an emitted value") from None
    if not -1 <= after < 2**31:
        raise ApiError(400, "invalid_parameter", "Last-Event-ID must be a seq, -1 to 2^31-1")
    return after


def _value(op: dict) -> dict:
    return {"seq": op["seq"], "value": op.get("result"), "at": op.get("ended_at")}


async def emitted(routes: FlowRoutes, request: web.Request) -> web.StreamResponse:
    tenant, run_id, outward_id = routes._run(request)
    after = _after(request)
    try:
        if "text/event-stream" in request.headers.get("Accept", ""):
            # (asked once before the stream begins: a run that is not there is a 404, not an empty stream)
            first = await routes.client.emitted(run_id, after, 100, 0.0, tenant=tenant)
            return await _follow(routes, request, run_id, tenant, after, first)
        limit, wait = int_param(request, "limit", 100, 1, 1000), int_param(request, "wait", 0, 0, MAX_WAIT_SECS)
        ops, nxt, status = await routes.client.emitted(run_id, after, limit, float(wait), tenant=tenant)
    except FlowError as exc:
        raise _error(exc) from None
    return json_response({"run_id": outward_id, "emitted": [_value(op) for op in ops], "next_after": nxt,
                          "status": status})


async def _follow(routes: FlowRoutes, request: web.Request, run_id: str, tenant: str, after: int,
                  first: tuple[list[dict], int | None, str]) -> web.StreamResponse:
    response = sse_response()
    await response.prepare(request)
    ops, nxt, status = first
    try:
        while True:
            if ops:
                await response.write(b"".join(render(op["seq"], b"emitted", _value(op)) for op in ops))
                after = ops[-1]["seq"]
            elif status in TERMINAL:
                run = await routes.client.get(run_id, tenant=tenant)
                end = {k: run[k] for k in ("status", "result", "error") if k in run}
                await response.write_eof(b"event: run.ended\ndata: %s\n\n" % orjson.dumps(end))
                return response
            else:
                await response.write(b": keep-alive\n\n")
            # (more than a page was there: the next at once; else wait for the next value)
            ops, nxt, status = await routes.client.emitted(run_id, after, 100, 0.0 if nxt is not None else FOLLOW_SECS,
                                                           tenant=tenant)
    except FlowError as exc:   # (the headers are out: the stream says so, and ends)
        try:
            await response.write_eof(b"event: error\ndata: %s\n\n" % orjson.dumps({"code": exc.code,
                                                                                    "message": exc.message}))
        except ConnectionError:
            pass
    except ConnectionError:   # the reader went away between two writes: nothing to tell
        pass
    return response
