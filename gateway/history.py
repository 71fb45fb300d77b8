"""Routes over what is durable: transcripts, events, checkpoints of external runtimes, and the
listing of sessions and of flow runs (a run itself is read from its actor: gateway/flows.py).

Reads of transcripts and events go to writer/store with `sync`, so they include everything
acknowledged before the request. A checkpoint PUT is appended to the log by the gateway itself
(answered once durable); the newest one per session is kept here for reads
(gateway/latest_checkpoints.py), and the store answers the rest.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from actors.closing import HOLD_SECS
from actors.flow_queues import MAX_KEY, valid_queue_key
from broker.client import BusError
from broker.protocol import RUN_MATCH, RUN_STATUSES, Kind
from broker.sharding import STORE, actor_name
from gateway.errors import LOG_WRITE_ERRORS, ApiError, int_param, json_response
from gateway.flows import NAME as FLOW_NAME
from gateway.latest_checkpoints import UNPLACED, Checkpoint, LatestCheckpoints
from gateway.tenancy import check_session_id, external, internal
from storage.bloom import BloomFilter
from storage.log_client import LogWriteError
from storage.records import RecordKind

if TYPE_CHECKING:
    from gateway.app import Gateway

# The checkpoint routes' paths: aiohttp's route table and the fast path (gateway/fast_path.py)
# both serve them, and both label metrics and access rows with these.
PUT_ROUTE = "/v1/sessions/{sid}/checkpoints/{key}"
LATEST_ROUTE = "/v1/sessions/{sid}/checkpoints/latest"
CHECKPOINT_KEY = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")
WRITE_ERRORS = {**LOG_WRITE_ERRORS, "not_found": (404, "not_found")}


def _hold_ends_by_itself(_reply, _exc) -> None:
    """A close's notice its actor did not take within HOLD_SECS: the hold has ended by then."""


def _order(request: web.Request, orders: tuple[str, str]) -> tuple[bool, str]:
    """(whether a listing is asked in its second order, `orders[1]`, and the name of its cursor
    then: `before`, else `after`); a 400 for another order, or for the other order's cursor."""
    order = request.query.get("order", orders[0])
    if order not in orders:
        raise ApiError(400, "invalid_parameter", f"order must be {orders[0]} or {orders[1]}")
    cursor_name, other = ("before", "after") if order == orders[1] else ("after", "before")
    if other in request.query:
        raise ApiError(400, "invalid_parameter", f"with order={order} the cursor is {cursor_name}, not {other}")
    return order == orders[1], cursor_name


def _seconds(raw: str) -> float | None:
    """`raw` as a finite time in UNIX seconds, None if it is not one."""
    try:
        when = float(raw)
    except ValueError:
        return None
    return when if math.isfinite(when) else None


def _time_param(request: web.Request, name: str) -> float | None:
    """Query parameter `name` as a time (UNIX seconds), None if absent; else a 400."""
    raw = request.query.get(name)
    if raw is None:
        return None
    if (when := _seconds(raw)) is None:
        raise ApiError(400, "invalid_parameter", f"{name} must be a time in UNIX seconds")
    return when


def _recent_cursor(value: str) -> tuple[float, str]:
    """A `next_before` of the sessions listed by recent activity: "<last_at>/<session id>"."""
    at, sep, sid = value.partition("/")
    if not sep or (when := _seconds(at)) is None:
        raise ApiError(400, "invalid_parameter", "before must be a next_before this listing gave")
    return when, check_session_id(sid)


log = logging.getLogger("agent-os.gateway")


class HistoryRoutes:
    def __init__(self, gateway: "Gateway") -> None:
        self.gw = gateway
        self._seq = 0
        self.latest = LatestCheckpoints(gateway.config.gateway.checkpoint_cache_mb << 20)
        # Where the logs ended when this process started ([[log, position], ...]), once the store
        # said: a cache miss reads the store as of there (see gateway/latest_checkpoints.py).
        self.settled: list | None = None
        # A session neither holds has certainly never had an external checkpoint, and a miss on it
        # is answered here, not by the store: a new session's first read (its runtime looking for
        # one to resume from). `before`: the store's filter as of `settled`, once it said; the
        # gateway writes every external checkpoint after that (`written`).
        self.before: BloomFilter | None = None
        self.written = BloomFilter()

    async def settle(self) -> None:
        """Ask the store where the logs end, then for its filter as of there, until it answers
        each (at start, beside serving)."""
        delay = 0.1
        while self.before is None:
            try:
                if self.settled is None:
                    reply = await self.gw.bus.request(STORE, Kind.STORE_QUERY, {"query": "log_ends", "session": ""},
                                                      timeout=10.0)
                    if not reply.body.get("error"):
                        self.settled = reply.body["rows"]
                        continue
                else:
                    reply = await self.gw.bus.request(STORE, Kind.STORE_QUERY, {
                        "query": "blob_filter", "session": "", "sync_to": self.settled}, timeout=35.0)
                    if not reply.body.get("error"):
                        self.before = BloomFilter.restore(reply.body["rows"][0])
                        log.info("the store's filter of sessions with checkpoints, as of this start, is here: "
                                 "a read of a session never written is answered without it")
                        return
            except (BusError, ValueError, KeyError, IndexError, TypeError):
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def never_checkpointed(self, sid: str) -> bool:
        """Whether `sid` certainly has no external checkpoint (False: it may have one)."""
        name = f"blob:{sid}"
        return self.before is not None and name not in self.before and name not in self.written

    async def _query(self, body: dict) -> dict:
        try:
            reply = await self.gw.bus.request(STORE, Kind.STORE_QUERY, body, timeout=35.0, attempt_secs=12.0,
                                              session=body["session"])
        except BusError as exc:
            raise ApiError(503, "storage_unavailable", f"the store did not answer: {exc}") from None
        if reply.body.get("error"):
            raise ApiError(503, "storage_unavailable", reply.body["error"])
        return reply.body

    async def list_sessions(self, request: web.Request) -> web.Response:
        """The tenant's sessions that hold a transcript or a checkpoint, a page at a time: by id,
        or with `order=recent` the most recently active first (as a chat app lists them), the
        next page `before` the cursor named (`next_before`: the last one's time and id)."""
        tenant = self.gw.tenant_of(request)
        recent, _ = _order(request, ("id", "recent"))
        query = {"query": "sessions", "session": "", "tenant": tenant, "sync": True,
                 "limit": int_param(request, "limit", 100, 1, 1000)}
        if not recent and request.query.get("after"):
            query["session"] = internal(tenant, check_session_id(request.query["after"]))
        elif recent:
            query["desc"] = True
            if "before" in request.query:
                query["at"], sid = _recent_cursor(request.query["before"])
                query["session"] = internal(tenant, sid)
        body = await self._query(query)
        nxt = body.get("next_after")
        rows = [{**row, "session_id": external(tenant, row["session_id"])} for row in body["rows"]]
        if recent:
            return json_response({"sessions": rows, "next_before": f"{rows[-1]['last_at']!r}/{rows[-1]['session_id']}"
                                  if nxt and rows else None})
        return json_response({"sessions": rows, "next_after": external(tenant, nxt) if nxt else None})

    async def get_session(self, request: web.Request) -> web.Response:
        """One session: its message count, first and last activity (as the listing has them),
        and its running turn, whose stream a client that lost it follows again by its id."""
        tenant, sid, external_sid = self.gw.session_of(request)
        try:
            summary, status = await asyncio.gather(
                self._query({"query": "session", "session": sid, "tenant": tenant, "sync": True}),
                self.gw.bus.request(actor_name(sid, self.gw.shards), Kind.SESSION_STATUS, {"session": sid},
                                    timeout=5.0, session=sid))
        except BusError as exc:
            raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}") from None
        running = status.body["state"] != "idle"
        if not summary["rows"] and not running:
            raise ApiError(404, "not_found", "no such session")
        row = summary["rows"][0] if summary["rows"] else {"messages": 0, "first_at": None, "last_at": None}
        active = {"turn_id": status.body["turn_id"], "resumed": status.body["state"] == "resumed",
                  "approvals": status.body.get("approvals") or []} if running else None
        return json_response({**row, "session_id": external_sid, "active_turn": active})

    async def list_runs(self, request: web.Request) -> web.Response:
        """The tenant's flow runs, a page at a time by id, optionally of one flow, one status
        (scheduled, enqueued, running, or open: any of those; completed, failed, cancelled), one
        flow queue, queue key or schedule, and those started in a window of time: after a
        cursor, or with `order=desc` from the last down, before one (the ids the server makes
        begin with their start time: the newest first). A page filtered so may hold fewer runs
        than `limit` and still name the next (storage/run_queries.py q_runs): the listing ends
        where `next_after` (`next_before`) is null."""
        tenant = self.gw.tenant_of(request)
        desc, cursor_name = _order(request, ("asc", "desc"))
        cursor, flow, status = (request.query.get(k) for k in (cursor_name, "flow", "status"))
        match = {k: request.query[k] for k in RUN_MATCH if k in request.query}
        for name, value in ((cursor_name, cursor), ("flow", flow), ("queue", match.get("queue")),
                            ("schedule", match.get("schedule"))):
            if value is not None and not FLOW_NAME.match(value):
                raise ApiError(400, "invalid_parameter", f"{name} must be 1-200 characters of letters, digits "
                                                         "and . _ : -")
        if "queue_key" in match and not valid_queue_key(match["queue_key"]):
            raise ApiError(400, "invalid_parameter", f"queue_key must be 1-{MAX_KEY} characters")
        if status is not None and status not in RUN_STATUSES:
            raise ApiError(400, "invalid_parameter", f"status must be one of: {', '.join(RUN_STATUSES)}")
        query = {"query": "runs", "session": internal(tenant, cursor) if cursor else "", "tenant": tenant,
                 "sync": True, "limit": int_param(request, "limit", 100, 1, 1000), "desc": desc}
        since, until = _time_param(request, "started_after"), _time_param(request, "started_before")
        query.update({k: v for k, v in (("flow", flow), ("status", status), ("since", since), ("until", until))
                      if v is not None}, **match)
        body = await self._query(query)
        nxt = body.get("next_after")
        return json_response({"runs": [{**row, "run_id": external(tenant, row["run_id"]),
                                        **{f: external(tenant, row[f]) for f in ("parent", "forked_from") if row.get(f)}}
                                       for row in body["rows"]],
                              f"next_{cursor_name}": external(tenant, nxt) if nxt else None})

    async def get_messages(self, request: web.Request) -> web.Response:
        return await self._page(request, "messages", "no such session (it has no messages)")

    async def get_events(self, request: web.Request) -> web.Response:
        return await self._page(request, "events", "no such session (or turn): it has no events")

    async def _page(self, request: web.Request, what: str, missing: str) -> web.Response:
        """A page of a session's transcript or events: after a cursor (oldest first), or with
        `order=desc` newest first, before a cursor (a chat opens on its last messages). The
        response's cursor for the next page is `next_after` or `next_before` by the order."""
        tenant, sid, external_sid = self.gw.session_of(request)
        order = request.query.get("order", "asc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "invalid_parameter", "order must be asc or desc")
        after = int_param(request, "after", -1, -1, 2**62)
        query = {"query": what, "session": sid, "tenant": tenant, "sync": True, "after": after,
                 "limit": int_param(request, "limit", 100, 1, 1000), "desc": order == "desc"}
        if "before" in request.query:
            query["before"] = int_param(request, "before", 0, 0, 2**62)
        if what == "events" and request.query.get("turn"):
            query["turn"] = request.query["turn"]
        body = await self._query(query)
        if not body["rows"] and after == -1 and "before" not in query:
            raise ApiError(404, "not_found", missing)
        return json_response({"session_id": external_sid, what: body["rows"],
                              ("next_before" if order == "desc" else "next_after"): body.get("next_after")})

    async def put_checkpoint(self, request: web.Request) -> web.Response:
        tenant, sid, external_sid = self.gw.session_of(request)
        key = check_key(request.match_info["key"])
        limit = self.gw.config.storage.max_checkpoint_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "checkpoint_too_large", f"checkpoint over {limit} bytes")
        payload = await self.gw.read_body(request, limit, "checkpoint_too_large")
        return json_response(await self.save_checkpoint(tenant, sid, external_sid, key, payload))

    async def save_checkpoint(self, tenant: str, sid: str, external_sid: str, key: str, payload: bytes) -> dict:
        """Append a checkpoint and return, once it is durable, the answer's JSON body."""
        fut = asyncio.get_running_loop().create_future()

        def done(body: dict | None, error: Exception | None) -> None:
            if not fut.done():
                fut.set_result(body) if error is None else fut.set_exception(error)
        self.save_checkpoint_then(tenant, sid, external_sid, key, payload, done)
        return await fut

    def save_checkpoint_then(self, tenant: str, sid: str, external_sid: str, key: str, payload: bytes,
                             done: Callable[[dict | None, Exception | None], None]) -> None:
        """Append a checkpoint; once it is durable call `done(body, None)` with the answer's JSON
        body, or `done(None, error)` (an ApiError when the log refused it)."""
        seq = self._next_seq()
        durability = self.gw.config.storage.durability
        self.written.add(f"blob:{sid}")   # before it can be durable: a read from now on asks the store

        def appended(position: int | None, error: BaseException | None) -> None:
            if error is None:
                where = UNPLACED if durability == "none" else (self.gw.log_client.log_of(sid), position)
                self.latest.offer(sid, Checkpoint(key, seq, payload, where))
                done({"session_id": external_sid, "key": key, "seq": seq, "durability": durability}, None)
            elif isinstance(error, LogWriteError):
                status, code = WRITE_ERRORS.get(error.code, (503, "storage_error"))
                done(None, ApiError(status, code, f"checkpoint not saved: {error}"))
            else:
                done(None, error)
        self.gw.log_client.append_then(RecordKind.BLOB, {"session": sid, "tenant": tenant, "key": key, "seq": seq,
                                                         "payload": payload, "at": time.time()}, sid, appended)

    async def close_session(self, request: web.Request) -> web.Response:
        """Close a session: its transcript, events and checkpoints are gone for every read once
        this answers, and leave the disk with the log's compaction (storage/session_closing.py).
        Closing one that has nothing is no error; its id may be used again, starting empty."""
        tenant, sid, _ = self.gw.session_of(request)
        actor = actor_name(sid, self.gw.shards)
        try:
            await self._close(tenant, sid, actor)
        finally:   # the actor holds the session's new turns until now (actors/closing.py)
            self.gw.bus.request_callback(actor, Kind.SESSION_CLOSED, {"session": sid}, _hold_ends_by_itself,
                                         timeout=HOLD_SECS, session=sid)
        return web.Response(status=204)

    async def _close(self, tenant: str, sid: str, actor: str) -> None:
        try:
            status = await self.gw.bus.request(actor, Kind.SESSION_CLOSE, {"session": sid, "deadline": time.time() + 15.0},
                                               timeout=15.0, session=sid)
        except BusError as exc:
            raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}") from None
        if status.body["state"] != "closed":
            raise ApiError(503, "storage_error", "the session's last records are not durable yet; try again")
        # Every record of the session acknowledged so far lies before these ends.
        upto = (await self._query({"query": "log_ends", "session": ""}))["rows"]
        try:
            await self.gw.log_client.append(RecordKind.CLOSE, {"session": sid, "tenant": tenant, "upto": upto,
                                                               "at": time.time()}, sid, sync=True)
        except LogWriteError as exc:
            status_code, code = WRITE_ERRORS.get(exc.code, (503, "storage_error"))
            raise ApiError(status_code, code, f"session not closed: {exc}") from None
        self.latest.forget(sid)

    def _next_seq(self) -> int:
        """Checkpoint numbers: microseconds since the epoch, strictly increasing in this process."""
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    async def get_latest_checkpoint(self, request: web.Request) -> web.Response:
        tenant, sid, _ = self.gw.session_of(request)
        latest = await self.latest_checkpoint(tenant, sid)
        return web.Response(body=latest.payload, content_type="application/octet-stream",
                            headers={"X-Checkpoint-Key": latest.key, "X-Checkpoint-Seq": str(latest.seq)})

    async def latest_checkpoint(self, tenant: str, sid: str) -> Checkpoint:
        latest = self.latest.get(sid)
        if latest is None:
            if self.never_checkpointed(sid):
                raise ApiError(404, "not_found", "this session has no checkpoint")
            query = {"query": "blob_latest", "session": sid, "tenant": tenant}
            need = self.latest.needed(sid)
            if self.settled is not None and need is not None:
                # the logs' ends at start, and where this session's pushed-out checkpoint lies
                for log, position in self.settled:
                    need[log] = max(need.get(log, 0), position)
                query["sync_to"] = sorted([log, position] for log, position in need.items())
            else:
                query["sync"] = True
            rows = (await self._query(query))["rows"]
            if not rows:
                raise ApiError(404, "not_found", "this session has no checkpoint")
            # A PUT acknowledged while the store answered is newer: offer() keeps whichever is.
            row = rows[0]
            latest = self.latest.offer(sid, Checkpoint(row["key"], row["seq"], row["payload"]))
        return latest


def check_key(key: str) -> str:
    if not CHECKPOINT_KEY.match(key):
        raise ApiError(400, "invalid_key", "checkpoint key must be 1-200 characters of letters, digits and . _ : -")
    return key
