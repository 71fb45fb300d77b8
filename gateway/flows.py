"""Routes over durable flows: start a run, fork one, read it, its steps, its attributes, update
one, publish to a channel, cancel it. Each is one request to the run's owning actor
(`actors.flow_client`)."""
from __future__ import annotations

import datetime
import math
import re
import time
from typing import TYPE_CHECKING

import msgpack
import orjson
from aiohttp import web

from actors.flow_client import WAITABLE, FlowClient, FlowError
from actors.flow_queues import MAX_KEY, MAX_PRIORITY, parse_queues, valid_priority, valid_queue_key
from broker.client import BusError
from broker.protocol import MAX_VALUE_BYTES, MAX_WHERE, Kind
from broker.sharding import SCHEDULER
from gateway.errors import LOG_WRITE_ERRORS, ApiError, int_param, json_response
from gateway.tenancy import external, internal

if TYPE_CHECKING:
    from agentos.config import Config
    from gateway.app import Gateway

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}$")
STATUS_OF = {"not_found": 404, "conflict": 409, "not_forkable": 409, "ended": 409, "handler_failed": 422,
             "unavailable": 503}


def _name(request: web.Request, key: str, what: str) -> str:
    value = request.match_info[key]
    if not NAME.match(value):
        raise ApiError(400, f"invalid_{what}", f"{what} must be 1-200 characters of letters, digits and . _ : -")
    return value


def _only(body: dict, fields: tuple[str, ...], shape: str) -> None:
    """A misspelt field would otherwise reach the run as a null (`{"x": 1}` published nothing)."""
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ApiError(400, "invalid_body", f"unknown field(s) {', '.join(map(repr, unknown))}: the body is {shape}")


def _check_size(value, what: str) -> None:
    """Only matters with gateway.max_body_bytes raised past the limit of what a run records."""
    size = len(msgpack.packb(value, use_bin_type=True))
    if size > MAX_VALUE_BYTES:
        raise ApiError(413, "value_too_large", f"{what} is {size:,} bytes as msgpack; a run records values "
                                               f"of at most {MAX_VALUE_BYTES:,} bytes")


def _error(exc: FlowError) -> ApiError:
    if exc.code in LOG_WRITE_ERRORS:   # the run's journal record was refused: nothing changed
        status, code = LOG_WRITE_ERRORS[exc.code]
        return ApiError(status, code, exc.message)
    return ApiError(STATUS_OF.get(exc.code, 502), exc.code, exc.message)


def _readable(value: object) -> object:
    """A step's value as JSON carries it: a step may return what msgpack carries and JSON does
    not (bytes, a map with bytes keys); such a value is shown by its type and size, not dropped
    silently nor answered with a 500."""
    try:
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
        return value
    except TypeError:
        return {"unreadable": type(value).__name__, "msgpack_bytes": len(msgpack.packb(value, use_bin_type=True))}


def _outward(run: dict, tenant: str) -> dict:
    out = {**run, "run_id": external(tenant, run["run_id"]),
           **{field: external(tenant, run[field]) for field in ("parent", "forked_from") if run.get(field)}}
    if isinstance(run.get("waiting_on"), dict) and "children" in run["waiting_on"]:
        out["waiting_on"] = {**run["waiting_on"], "children": [external(tenant, c) for c in run["waiting_on"]["children"]]}
    return out


def _new_run(request: web.Request, body: dict) -> tuple[str | None, str | None]:
    """The id a start or a fork asks for (`run_id` in its body), and its `Idempotency-Key`."""
    run_id = body.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not NAME.match(run_id)):
        raise ApiError(400, "invalid_run_id", "run_id must be 1-200 characters of letters, digits and . _ : -")
    return run_id, _idempotency_key(request)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 0 < len(key) <= 200:
        raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-200 characters")
    return key


MAX_DELAY_SECS = 366 * 86400


def _start_at(body: dict) -> float | None:
    """When a delayed start runs (epoch seconds), from `start_at` (epoch seconds, or an ISO 8601
    time with its offset) or `delay_secs`; None: at once."""
    at, delay = body.get("start_at"), body.get("delay_secs")
    if at is not None and delay is not None:
        raise ApiError(400, "invalid_start_at", "give start_at or delay_secs, not both")
    now = time.time()
    if delay is not None:
        if type(delay) not in (int, float) or not 0 <= delay <= MAX_DELAY_SECS:
            raise ApiError(400, "invalid_start_at", f"delay_secs must be a number of seconds, 0 to {MAX_DELAY_SECS}")
        return now + delay if delay else None
    if at is None:
        return None
    if isinstance(at, str):
        try:
            parsed = datetime.datetime.fromisoformat(at)
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise ApiError(400, "invalid_start_at", "start_at must be an ISO 8601 time with its offset "
                                                    "(2026-12-06T10:00:00Z) or epoch seconds")
        at = parsed.timestamp()
    if type(at) not in (int, float) or not math.isfinite(at) or at > now + MAX_DELAY_SECS:
        raise ApiError(400, "invalid_start_at", f"start_at must be a time at most {MAX_DELAY_SECS // 86400} days ahead")
    return float(at) if at > now else None   # a time past: at once


def known_queue(config: Config, body: dict) -> str | None:
    """The body's `queue`, if any: one of `kernel.flow_queues` (400 if not)."""
    queue, queues = body.get("queue"), parse_queues(config.kernel.flow_queues)
    if queue is not None and (type(queue) is not str or queue not in queues):
        raise ApiError(400, "unknown_queue", f"queue must name a flow queue of this server (kernel.flow_queues): "
                                             f"{', '.join(sorted(queues)) or 'it has none'}")
    return queue


def _queue_key(config: Config, queue: str | None, body: dict) -> str | None:
    """The body's `queue_key`: a start into a queue per key names one, no other start does (400)."""
    key, spec = body.get("queue_key"), parse_queues(config.kernel.flow_queues).get(queue) if queue else None
    per_key = spec is not None and spec.per == "key"
    if (key is None) == per_key or (key is not None and not valid_queue_key(key)):
        raise ApiError(400, "invalid_queue_key", f"queue {queue!r} is per key: a start names its queue_key, 1 to "
                                                 f"{MAX_KEY} characters" if per_key else
                                                 "queue_key is only for a start into a queue per key")
    return key


class FlowRoutes:
    def __init__(self, gateway: "Gateway") -> None:
        self.gw = gateway
        self.client = FlowClient(gateway.bus, gateway.shards)

    def _run(self, request: web.Request) -> tuple[str, str, str]:
        """(tenant, run id inside the server, run id as the client names it)."""
        run_id = _name(request, "run_id", "run_id")
        tenant = self.gw.tenant_of(request)
        return tenant, internal(tenant, run_id), run_id

    async def start(self, request: web.Request) -> web.Response:
        flow = _name(request, "flow", "flow")
        tenant = self.gw.tenant_of(request)
        body = await self.gw.json_body(request)
        _only(body, ("input", "run_id", "start_at", "delay_secs", "timeout_secs", "queue", "priority", "queue_key"),
              '{"input": ..., "run_id": ..., "start_at" or "delay_secs": ..., "timeout_secs": ..., "queue": ..., '
              '"priority": ..., "queue_key": ...}')
        _check_size(body.get("input"), "input")
        start_at, timeout = _start_at(body), body.get("timeout_secs")
        if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout <= MAX_DELAY_SECS):
            raise ApiError(400, "invalid_timeout", f"timeout_secs must be a number of seconds above 0, at most "
                                                   f"{MAX_DELAY_SECS}")
        queue, priority = known_queue(self.gw.config, body), body.get("priority", 0)
        if not valid_priority(priority) or (priority and queue is None):
            raise ApiError(400, "invalid_priority", f"priority must be a whole number, 0 (the default: first) to "
                                                    f"{MAX_PRIORITY}, given with a queue")
        queue_key = _queue_key(self.gw.config, queue, body)
        chosen, new = self.client.run_id(flow, tenant, *_new_run(request, body))
        try:
            run = await self.client.start_run(flow, body.get("input"), internal(tenant, chosen), new, tenant,
                                              start_at, timeout, queue, priority, queue_key)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response(_outward(run, tenant), status=201 if run.get("created") else 200)

    async def fork(self, request: web.Request) -> web.Response:
        """A new run of this run's flow and input that replays its operations before `from_seq`
        (default: its first that did not succeed) and goes on from there (actors/run_forks.py)."""
        tenant, source, _ = self._run(request)
        body = await self.gw.json_body(request) if request.can_read_body else {}
        _only(body, ("from_seq", "run_id", "queue"), '{"from_seq": ..., "run_id": ..., "queue": ...}')
        from_seq = body.get("from_seq")
        if from_seq is not None and (type(from_seq) is not int or not 0 <= from_seq < 2**31):
            raise ApiError(400, "invalid_from_seq", "from_seq must be an operation's seq, an integer >= 0")
        queue = known_queue(self.gw.config, body)
        chosen, new = self.client.fork_id(source, tenant, *_new_run(request, body))
        try:
            run = await self.client.fork_run(source, from_seq, internal(tenant, chosen), new, tenant, queue)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response(_outward(run, tenant), status=201 if run.get("created") else 200)

    async def queues(self, request: web.Request) -> web.Response:
        """The flow queues (`kernel.flow_queues`): each one's limit and rate, runs admitted and
        runs waiting, across tenants and the caller's own (`own`), as the scheduler that holds
        their places counts them."""
        tenant = self.gw.tenant_of(request)
        try:
            reply = await self.gw.bus.request(SCHEDULER, Kind.STATS, {"tenant": tenant}, timeout=5.0, attempt_secs=2.5)
        except BusError as exc:
            raise ApiError(503, "unavailable", f"the scheduler did not answer: {exc}") from None
        counts = (reply.body.get("stats") or {}).get("flow_queues") or {}
        listed = []
        for name, spec in parse_queues(self.gw.config.kernel.flow_queues).items():
            counted = counts.get(name) or {}
            queue = {"name": name, "limit": spec.limit, "running": counted.get("running", 0),
                     "waiting": counted.get("waiting", 0), "rate": spec.rate(), "per": spec.per,
                     "own": {"running": counted.get("own_running", 0), "waiting": counted.get("own_waiting", 0)}}
            if spec.per:
                queue["keys"] = counted.get("keys", 0)
            if queue["rate"] is not None:
                queue["rate"]["started"] = counted.get("started_in_window", 0)
            listed.append(queue)
        return json_response({"queues": listed})

    async def workers(self, request: web.Request) -> web.Response:
        """The workers the scheduler knows now: what each runs, its slots, tasks and whether it
        drains. They serve every tenant, as the flows and tools they offer do."""
        self.gw.tenant_of(request)
        try:
            reply = await self.gw.bus.request(SCHEDULER, Kind.STATS, {"workers": True}, timeout=5.0, attempt_secs=2.5)
        except BusError as exc:
            raise ApiError(503, "unavailable", f"the scheduler did not answer: {exc}") from None
        return json_response({"workers": (reply.body.get("stats") or {}).get("workers") or []})

    async def get(self, request: web.Request) -> web.Response:
        tenant, run_id, outward_id = self._run(request)
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            raise ApiError(400, "invalid_parameter", "wait must be a number of seconds") from None
        if not 0 <= wait <= 60:
            raise ApiError(400, "invalid_parameter", "wait must be between 0 and 60 seconds")
        until = request.query.get("until")
        if until is not None and until not in WAITABLE:
            raise ApiError(400, "invalid_parameter", f"until must be one of: {', '.join(WAITABLE)}")
        try:
            return json_response(_outward(await self.client.get(run_id, wait=wait, tenant=tenant, until=until),
                                          tenant))
        except FlowError as exc:
            raise _error(exc) from None

    async def steps(self, request: web.Request) -> web.Response:
        """The run's operations in order (steps, sleeps, waits, children, attribute writes), each
        with its state, attempts, times and outcome, a page at a time by seq (`after`, `limit`)."""
        tenant, run_id, outward_id = self._run(request)
        after, limit = int_param(request, "after", -1, -1, 2**31), int_param(request, "limit", 100, 1, 1000)
        try:
            ops, nxt = await self.client.steps(run_id, after, limit, tenant=tenant)
        except FlowError as exc:
            raise _error(exc) from None
        for op in ops:
            for field in ("result", "heartbeat"):
                if field in op:
                    op[field] = _readable(op[field])
            if op.get("child"):
                op["child"] = external(tenant, op["child"])
        return json_response({"run_id": outward_id, "steps": ops, "next_after": nxt})

    async def attributes(self, request: web.Request) -> web.Response:
        tenant, run_id, outward_id = self._run(request)
        keys = [k for k in request.query.get("keys", "").split(",") if k]
        try:
            values = await self.client.attributes(run_id, keys or None, tenant=tenant)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response({"run_id": outward_id, "attributes": values})

    async def update(self, request: web.Request) -> web.Response:
        tenant, run_id, outward_id = self._run(request)
        key = _name(request, "key", "key")
        body = await self.gw.json_body(request)
        _only(body, ("handler", "arg"), '{"handler": ..., "arg": ...}')
        _check_size(body.get("arg"), "arg")
        handler = body.get("handler")
        if not isinstance(handler, str) or not NAME.match(handler):
            raise ApiError(400, "invalid_handler", "body must name an update handler: {\"handler\": ..., \"arg\": ...}")
        try:
            value = await self.client.update(run_id, key, handler, body.get("arg"), tenant=tenant)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response({"run_id": outward_id, "key": key, "value": value})

    async def publish(self, request: web.Request) -> web.Response:
        tenant, run_id, outward_id = self._run(request)
        channel = _name(request, "channel", "channel")
        body = await self.gw.json_body(request)
        _only(body, ("message",), '{"message": ...}')
        _check_size(body.get("message"), "message")
        key = _idempotency_key(request)
        try:
            await self.client.publish(run_id, channel, body.get("message"), tenant=tenant, key=key)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response({"run_id": outward_id, "channel": channel, "published": True}, status=202)

    async def broadcast(self, request: web.Request) -> web.Response:
        """`POST /v1/channels/{channel}`: the message to every run of the tenant waiting on the
        channel now, durably in each before 200 `{"delivered": n}`."""
        tenant = self.gw.tenant_of(request)
        channel = _name(request, "channel", "channel")
        body = await self.gw.json_body(request)
        _only(body, ("message", "flow", "where"), '{"message": ..., "flow": ..., "where": {attribute: value}}')
        _check_size(body.get("message"), "message")
        flow, where = body.get("flow"), body.get("where")
        if flow is not None and not (isinstance(flow, str) and NAME.match(flow)):
            raise ApiError(400, "invalid_flow", "flow must be 1-200 characters of letters, digits and . _ : -")
        if where is not None and not (isinstance(where, dict) and 0 < len(where) <= MAX_WHERE):
            raise ApiError(400, "invalid_where", f"where must be an object naming 1 to {MAX_WHERE} attributes, each "
                                                 "with the value a run's must have")
        key = _idempotency_key(request)
        try:
            delivered = await self.client.broadcast(channel, body.get("message"), tenant=tenant, key=key, flow=flow,
                                                    where=where)
        except FlowError as exc:
            raise _error(FlowError(exc.code, f"{exc.message}; some runs may have taken it: send it again "
                                             "with the same Idempotency-Key to reach the others")) from None
        return json_response({"channel": channel, "delivered": delivered})

    async def waiting(self, request: web.Request) -> web.Response:
        """`GET /v1/channels/{channel}`: the runs a publish to it would reach now (`?flow=`): how
        many, and the `limit` that have waited longest."""
        tenant = self.gw.tenant_of(request)
        channel = _name(request, "channel", "channel")
        flow = request.query.get("flow")
        if flow is not None and not NAME.match(flow):
            raise ApiError(400, "invalid_flow", "flow must be 1-200 characters of letters, digits and . _ : -")
        limit = int_param(request, "limit", 100, 1, 1000)
        try:
            count, runs = await self.client.waiting(channel, tenant=tenant, flow=flow, limit=limit)
        except FlowError as exc:
            raise _error(exc) from None
        return json_response({"channel": channel, "count": count,
                              "runs": [{**run, "run_id": external(tenant, run["run_id"])} for run in runs]})

    async def cancel(self, request: web.Request) -> web.Response:
        tenant, run_id, _ = self._run(request)
        try:
            return json_response(_outward(await self.client.cancel(run_id, tenant=tenant), tenant))
        except FlowError as exc:
            raise _error(exc) from None
