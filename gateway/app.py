"""The gateway: HTTP API, SSE streams of turns, the admission gate, health and metrics.

It runs no agent logic: a turn is a `turn.start` to the session's actor, whose numbered events
come back over the bus and are written to the client as Server-Sent Events. The routes are
listed in one table (`Gateway.routes`).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

import orjson
from aiohttp import web

from agentos import metrics
from agentos.config import Config
from broker.client import Bus, BusError
from broker.protocol import TURN_EVENTS, TURN_START_TIMEOUT_SECS, Kind, Message
from broker.sharding import STORE, actor_name
from gateway.access import AccessLog, access_middleware
from gateway.errors import ApiError, error_response, json_response
from gateway import openapi
from gateway.flows import FlowRoutes
from gateway.history import LATEST_ROUTE, PUT_ROUTE, HistoryRoutes
from gateway.new_sessions import fork_session, new_session
from gateway.peer_watch import PeerWatch
from gateway.schedules import ScheduleRoutes
from gateway.run_emitted import emitted
from gateway.streams import TurnStream, sse_response
from gateway.turn_controls import APPROVAL_ROUTE, answer_approval, cancel_turn
from gateway.tenancy import DEFAULT_TENANT, SESSION_ID, check_session_id, internal
from gateway.turn_input import keyed_turn_id, turn_input
from storage import compaction_reserve, free_space
from storage.log_client import LogClient
from storage.log_writer import LogWriter

KEEPALIVE_SECS = 15.0
MAX_FAILED_PROBES = 6
DISCONNECT_CANCEL_SECS = 60.0   # a disconnected client's cancel is sent for this long


def _unanswered_cancel(_reply, _exc) -> None:
    """Nothing more is done for a cancel no actor took in DISCONNECT_CANCEL_SECS: its turn runs
    to its end, as one did whenever a cancel was lost."""


class Gateway:
    def __init__(self, config: Config, bus_endpoint: str, index: int, log: logging.Logger,
                 own_log: LogWriter | None = None) -> None:
        self.config = config
        self.log = log
        self.name = f"gateway/{index}"
        self.shards = config.actor_count
        self.bus = Bus(self.name, bus_endpoint, {}, heartbeat_secs=config.broker.heartbeat_secs, log=log,
                       spill_bytes=config.broker.spill_ring_bytes)
        for kind in TURN_EVENTS:
            self.bus.on(kind, self.on_turn_event)
        self.bus.on(Kind.DRAIN, self.on_drain)
        self.bus.on(Kind.STATS, self.on_stats)
        self.streams: dict[str, list[TurnStream]] = {}   # turn id -> its subscribers here
        self.in_flight = 0
        self.draining = False
        self.peer_watch = PeerWatch(self.bus, ["scheduler", STORE] + [f"writer/log/{i}" for i in range(config.logs)]
                                    + [f"actor/{i}" for i in range(self.shards)])
        self.turn_counter = 0
        self.api_keys = config.auth.api_keys
        self.limit = config.kernel.max_in_flight_turns
        self.tenant_limit = config.kernel.max_in_flight_turns_per_tenant
        self.in_flight_by_tenant: dict[str, int] = {}
        self.retry_after = str(config.gateway.retry_after_secs)
        self.log_client = LogClient(self.bus, config.storage.log_writers, own_log=own_log)
        self.access = AccessLog(self.log_client)
        self.history = HistoryRoutes(self)
        self.flow_routes = FlowRoutes(self)
        self._openapi = orjson.dumps(openapi.document())
        metrics.admission_limit.set(self.limit)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/sessions", functools.partial(new_session, self)),
            web.get("/v1/sessions", self.history.list_sessions),
            web.get("/v1/sessions/{sid}", self.history.get_session),
            web.delete("/v1/sessions/{sid}", self.history.close_session),
            web.post("/v1/sessions/{sid}/fork", functools.partial(fork_session, self)),
            web.post("/v1/sessions/{sid}/turns", self.post_turn),
            web.delete("/v1/sessions/{sid}/turns/current", functools.partial(cancel_turn, self)),
            web.get("/v1/sessions/{sid}/turns/{turn_id}/events", self.resume_turn),
            web.post(APPROVAL_ROUTE, functools.partial(answer_approval, self)),
            web.get("/v1/sessions/{sid}/messages", self.history.get_messages),
            web.get("/v1/sessions/{sid}/events", self.history.get_events),
            web.put(PUT_ROUTE, self.history.put_checkpoint),
            web.get(LATEST_ROUTE, self.history.get_latest_checkpoint),
            web.post("/v1/flows/{flow}/runs", self.flow_routes.start),
            web.get("/v1/runs", self.history.list_runs),
            web.get("/v1/queues", self.flow_routes.queues),
            web.get("/v1/workers", self.flow_routes.workers),
            web.get("/v1/runs/{run_id:[^/:]+}", self.flow_routes.get),
            web.post("/v1/runs/{run_id:[^/:]+}:cancel", self.flow_routes.cancel),
            web.post("/v1/runs/{run_id:[^/:]+}:fork", self.flow_routes.fork),
            web.get("/v1/runs/{run_id:[^/:]+}/steps", self.flow_routes.steps),
            web.get("/v1/runs/{run_id:[^/:]+}/emitted", functools.partial(emitted, self.flow_routes)),
            web.get("/v1/runs/{run_id:[^/:]+}/attributes", self.flow_routes.attributes),
            web.post("/v1/runs/{run_id:[^/:]+}/attributes/{key:[^/:]+}:update", self.flow_routes.update),
            web.post("/v1/runs/{run_id:[^/:]+}/channels/{channel}", self.flow_routes.publish),
            web.post("/v1/channels/{channel}", self.flow_routes.broadcast),
            web.get("/v1/channels/{channel}", self.flow_routes.waiting),
            *ScheduleRoutes(self).routes(),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics),
            web.get("/openapi.json", self.openapi),
        ]

    def make_app(self) -> web.Application:
        limit = max(self.config.gateway.max_body_bytes, self.config.storage.max_checkpoint_bytes)
        app = web.Application(middlewares=[access_middleware(self.access)], client_max_size=limit + 1)
        app.add_routes(self.routes())
        return app

    # -- helpers --------------------------------------------------------------------------

    def tenant_of(self, request: web.Request) -> str:
        tenant = request["tenant"] = self.tenant_for(request.headers.get("Authorization", ""))
        return tenant

    def tenant_for(self, authorization: str) -> str:
        """The tenant an `Authorization` header value names (any, when no API keys are set)."""
        if not self.api_keys:
            return DEFAULT_TENANT
        scheme, _, key = authorization.partition(" ")
        tenant = self.api_keys.get(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise ApiError(401, "unauthorized", "missing or unknown API key (Authorization: Bearer KEY)")
        return tenant

    def session_id(self, request: web.Request) -> str:
        return check_session_id(request.match_info["sid"])

    def session_of(self, request: web.Request) -> tuple[str, str, str]:
        """(tenant, session id inside the server, session id as the client names it)."""
        sid = self.session_id(request)
        tenant = self.tenant_of(request)
        return tenant, internal(tenant, sid), sid

    async def read_body(self, request: web.Request, limit: int, code: str = "body_too_large") -> bytes:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raw = None
        if raw is None or len(raw) > limit:
            raise ApiError(413, code, f"request body over {limit} bytes")
        return raw

    async def json_body(self, request: web.Request) -> dict:
        raw = await self.read_body(request, self.config.gateway.max_body_bytes)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(400, "invalid_json", "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_json", "request body must be a JSON object")
        return body

    def new_turn_id(self) -> str:
        self.turn_counter += 1
        return f"t{self.bus.incarnation:08x}{self.turn_counter:08x}"

    # -- routes ---------------------------------------------------------------------------

    async def post_turn(self, request: web.Request) -> web.StreamResponse:
        tenant, sid, external_sid = self.session_of(request)
        if self.draining:
            raise ApiError(503, "draining", "server is shutting down", {"Retry-After": self.retry_after})
        text, system = turn_input(await self.json_body(request), self.config.gateway.max_input_chars)
        keyed = keyed_turn_id(request, tenant, sid)
        if self.limit and self.in_flight >= self.limit:
            metrics.admission_rejected.inc()
            return error_response(429, "overloaded", f"{self.in_flight} turns in flight (limit {self.limit}); retry later",
                                  {"Retry-After": self.retry_after})
        mine = self.in_flight_by_tenant.get(tenant, 0)
        if self.tenant_limit and mine >= self.tenant_limit:
            metrics.admission_rejected.inc()
            return error_response(429, "overloaded", f"this tenant has {mine} turns in flight (its share is "
                                  f"{self.tenant_limit}); retry later", {"Retry-After": self.retry_after})
        self.in_flight += 1
        self.in_flight_by_tenant[tenant] = mine + 1
        try:
            return await self._stream_turn(request, sid, tenant, text, external_sid, system, keyed)
        finally:
            self.in_flight -= 1
            left = self.in_flight_by_tenant[tenant] - 1
            if left:
                self.in_flight_by_tenant[tenant] = left
            else:
                del self.in_flight_by_tenant[tenant]

    async def _stream_turn(self, request: web.Request, sid: str, tenant: str, text: str,
                           external_sid: str, system: str | None, keyed: str | None) -> web.StreamResponse:
        turn_id = keyed or self.new_turn_id()
        actor = actor_name(sid, self.shards)
        stream = self._subscribe(TurnStream(turn_id, sid, actor, tenant, external_sid))
        try:
            try:
                started = await self.bus.request(actor, Kind.TURN_START,
                                                 {"turn_id": turn_id, "session": sid, "tenant": tenant, "input": text,
                                                  "deadline": time.time() + TURN_START_TIMEOUT_SECS,
                                                  **({"system": system} if system is not None else {}),
                                                  "stream": stream.token, **({"keyed": True} if keyed else {})},
                                                 timeout=TURN_START_TIMEOUT_SECS, session=sid, turn=turn_id)
            except BusError as exc:   # a start nobody will stream may still reach a stalled actor
                self._cancel_stream(stream, "start_timeout")
                raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}",
                               {"Retry-After": self.retry_after}) from None
            except asyncio.CancelledError:   # the client left before its turn started
                # a keyed start's client may send it again: a turn begun waits the grace, as a broken
                # stream's (at once, it ended under the client that came back)
                self._cancel_stream(stream, "disconnect", self.config.kernel.disconnect_grace_secs if keyed else 0.0)
                raise
            if started.kind is not Kind.TURN_STARTED:   # a keyed start whose turn is not to be streamed
                code = started.body.get("code") or "conflict"
                raise ApiError(503 if code == "unavailable" else 409, code, started.body.get("error") or code)
            stream.push(Kind.TURN_STARTED, started.body)
            return await self._pump(request, stream)
        finally:
            self._unsubscribe(stream)

    async def resume_turn(self, request: web.Request) -> web.StreamResponse:
        """The rest of a turn's events after the client's last one (`Last-Event-ID` or `?after`),
        then live ones until the turn ends; replayable for `kernel.turn_retention_secs` after."""
        tenant, sid, external_sid = self.session_of(request)
        turn_id = request.match_info["turn_id"]
        if not SESSION_ID.match(turn_id):
            raise ApiError(400, "invalid_turn_id", "not a turn id")
        raw = request.headers.get("Last-Event-ID", request.query.get("after", "0"))
        try:
            after = int(raw)
        except ValueError:
            raise ApiError(400, "invalid_parameter", "Last-Event-ID (or after) must be an event id: an integer") from None
        if after < 0:
            raise ApiError(400, "invalid_parameter", "Last-Event-ID (or after) must not be negative")
        actor = actor_name(sid, self.shards)
        stream = self._subscribe(TurnStream(turn_id, sid, actor, tenant, external_sid))
        stream.last_seq = after
        try:
            try:
                status = await self.bus.request(actor, Kind.TURN_RESUME, {"turn_id": turn_id, "session": sid,
                                                                          "after": after, "stream": stream.token},
                                                timeout=10.0, session=sid)
            except BusError as exc:
                raise ApiError(503, "actor_unavailable", f"the session's actor did not answer: {exc}") from None
            state = status.body["state"]
            if state == "unknown":
                raise ApiError(404, "not_found", "no such turn (or its events are past their retention)")
            if state == "resumed":
                stream.interrupted()
            if state == "ended" and after >= status.body.get("last", after + 1):
                # The client has every event, the terminal one too: a stream would wait for good.
                # 204 is also what tells an EventSource to stop reconnecting.
                return web.Response(status=204)
            return await self._pump(request, stream)
        finally:
            self._unsubscribe(stream)

    def _cancel_stream(self, stream: TurnStream, reason: str, grace_secs: float = 0.0) -> None:
        """Cancel the turn of a stream nobody reads, after `grace_secs` unless a client comes back
        for it. Sent until the actor takes it: sent once, an actor stalled past the broker's peer
        timeout lost it, and a turn nobody reads ran (and paid for tokens) to its end. It names the
        stream: a start of it that comes later is not run, and a later stream of the turn (a keyed
        start sent again) is not cancelled by it (actors/actor_process.py)."""
        self.bus.request_callback(stream.actor, Kind.TURN_CANCEL, {
            "session": stream.session, "turn_id": stream.turn_id, "stream": stream.token, "reason": reason,
            **({"after_secs": grace_secs} if grace_secs else {})}, _unanswered_cancel,
            timeout=DISCONNECT_CANCEL_SECS, attempt_secs=2.0, session=stream.session)

    def _subscribe(self, stream: TurnStream) -> TurnStream:
        self.streams.setdefault(stream.turn_id, []).append(stream)
        return stream

    def _unsubscribe(self, stream: TurnStream) -> None:
        subscribers = self.streams.get(stream.turn_id)
        if subscribers is not None:
            subscribers.remove(stream)
            if not subscribers:
                del self.streams[stream.turn_id]

    async def _pump(self, request: web.Request, stream: TurnStream) -> web.StreamResponse:
        """Write the stream's events as SSE until its terminal one. A client that goes away
        cancels the turn after `kernel.disconnect_grace_secs`, unless it comes back for the rest."""
        response = sse_response()
        try:
            await response.prepare(request)
            while True:
                chunks = await stream.next_chunks(KEEPALIVE_SECS)
                data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
                if stream.terminal is not None and not stream.chunks:
                    await response.write_eof(data)  # the last events and the end of the body in one write
                    break
                await response.write(data)
            return response
        except (asyncio.CancelledError, ConnectionError) as exc:
            if stream.terminal is None:
                self._cancel_stream(stream, "disconnect", self.config.kernel.disconnect_grace_secs)
            if isinstance(exc, asyncio.CancelledError):
                raise
            # The client went away between two writes (its connection was found closed before
            # aiohttp cancelled this handler): routine for a stream, not a server error to log
            # with a traceback. aiohttp finds the connection gone when it ends the response.
            self.log.debug("stream of turn %s: client gone (%s)", stream.turn_id, exc)
            return response

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.draining:
            return error_response(503, "draining", "server is shutting down")
        if self.peer_watch.missing:
            return error_response(503, "not_ready", "waiting for: " + ", ".join(self.peer_watch.missing))
        return json_response({"ready": True, "in_flight": self.in_flight})

    async def metrics(self, request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, self._render_metrics)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _render_metrics(self) -> bytes:
        volumes = compaction_reserve.volumes(self.config.storage.dir)
        for volume, room in volumes.items():
            metrics.disk_free_bytes.labels(volume).set(room["free_bytes"])
        if "wal" in volumes:
            metrics.logs_min_free_bytes.set(free_space.margin(self.config.storage.min_free_bytes,
                                                              self.config.storage.segment_bytes,
                                                              volumes["wal"]["total_bytes"]))
        return metrics.render()

    # -- bus ------------------------------------------------------------------------------

    def on_turn_event(self, msg: Message) -> None:
        for stream in self.streams.get(msg.body["turn_id"], ()):
            stream.push(msg.kind, msg.body)

    async def on_drain(self, msg: Message) -> None:
        self.draining = True
        metrics.draining.set(1)
        deadline = time.monotonic() + float(msg.body["deadline_secs"])
        self.log.info("draining: no new turns; waiting up to %.0fs for %d in flight", msg.body["deadline_secs"],
                      self.in_flight)
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.bus.reply(msg, Kind.DRAINED, {"in_flight": self.in_flight})

    def on_stats(self, msg: Message) -> None:
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "gateway", "stats": {
            "in_flight": self.in_flight, "admission_limit": self.limit, "streams": len(self.streams),
            "draining": self.draining, "bus": self.bus.stats()}})

    async def watch(self) -> None:
        """Readiness from the broker's peer table, and probes of silent or gapped turns."""
        last_peers = 0.0
        while True:
            await asyncio.sleep(0.25)
            metrics.in_flight_turns.set(self.in_flight)
            now = time.monotonic()
            if now - last_peers >= 1.0:
                last_peers = now
                self.bus.spawn(self.peer_watch.check())
            probe_after = self.config.gateway.turn_probe_secs
            for stream in [s for subscribers in self.streams.values() for s in subscribers]:
                if stream.probing or stream.terminal is not None:
                    continue
                if (stream.gap_since and now - stream.gap_since > 0.5) or now - stream.last_event_at > probe_after:
                    stream.probing = True
                    self.bus.spawn(self.probe(stream))

    async def probe(self, stream: TurnStream) -> None:
        """Ask the actor to replay what this stream missed; end the stream if the turn is gone."""
        try:
            status = await self.bus.request(stream.actor, Kind.TURN_RESUME,
                                            {"turn_id": stream.turn_id, "session": stream.session,
                                             "after": stream.last_seq, "stream": stream.token}, timeout=5.0,
                                            session=stream.session)
            stream.failed_probes = 0
            stream.last_event_at = time.monotonic()
            if status.body["state"] == "unknown":
                stream.fail("turn_lost", "the turn was lost: its actor restarted before the turn ended")
            elif status.body["state"] == "resumed":
                stream.interrupted()
        except BusError:
            stream.failed_probes += 1
            if stream.failed_probes >= MAX_FAILED_PROBES:
                stream.fail("actor_unavailable", "the session's actor stopped answering")
        finally:
            stream.probing = False
