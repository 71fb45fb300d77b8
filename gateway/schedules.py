"""Routes over schedules (actors/schedules.py): create or change one, read it, delete it, list
them. Each but the listing is one request to the actor the schedule's name routes to; the
listing asks every actor for the tenant's and merges them by name."""
from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from aiohttp import web

from actors.cron import Cron, CronError
from actors.schedules import DEFAULT_CATCHUP_SECS, MAX_CATCHUP_SECS, schedule_key
from broker.client import BusError
from broker.protocol import Kind
from broker.sharding import actor_name
from gateway.errors import LOG_WRITE_ERRORS, ApiError, int_param, json_response
from gateway.flows import NAME, _check_size, _only, known_queue
from gateway.tenancy import internal

if TYPE_CHECKING:
    from gateway.app import Gateway

MAX_NAME = 150   # its runs are named <name>-<time>, within a run id's 200 characters
ASK_SECS = 30.0
BODY = '{"flow": ..., "cron": ..., "input": ..., "timezone": ..., "catchup_secs": ..., "queue": ...}'


class ScheduleRoutes:
    def __init__(self, gateway: "Gateway") -> None:
        self.gw = gateway

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/v1/schedules", self.list), web.put("/v1/schedules/{name}", self.put),
                web.get("/v1/schedules/{name}", self.get), web.delete("/v1/schedules/{name}", self.delete)]

    def _key(self, request: web.Request) -> tuple[str, str, str]:
        """(tenant, the schedule's routing key, its name as the client gave it)."""
        name = request.match_info["name"]
        if not (NAME.match(name) and len(name) <= MAX_NAME and "~" not in name):
            raise ApiError(400, "invalid_schedule_name",
                           f"a schedule's name is 1-{MAX_NAME} characters of letters, digits and . _ : -")
        tenant = self.gw.tenant_of(request)
        return tenant, schedule_key(internal(tenant, name)), name

    async def _ask(self, actor: str, kind: Kind, body: dict, session: str = "") -> dict:
        if kind in (Kind.SCHEDULE_PUT, Kind.SCHEDULE_DELETE):   # not acted on once this has given up
            body = {**body, "deadline": time.time() + ASK_SECS}
        try:
            reply = await self.gw.bus.request(actor, kind, body, timeout=ASK_SECS, attempt_secs=5.0, session=session)
        except BusError as exc:
            raise ApiError(503, "unavailable", f"the schedule's actor did not answer: {exc}") from None
        code = reply.body.get("code")
        if code in LOG_WRITE_ERRORS:
            status, code = LOG_WRITE_ERRORS[code]
            raise ApiError(status, code, reply.body.get("error") or code)
        if code:
            raise ApiError(400 if code == "invalid_schedule" else 502, code, reply.body.get("error") or code)
        return reply.body

    async def put(self, request: web.Request) -> web.Response:
        """Create the schedule, or change it (its next time counts from the change)."""
        tenant, key, name = self._key(request)
        body = await self.gw.json_body(request)
        _only(body, ("flow", "cron", "input", "timezone", "catchup_secs", "queue"), BODY)
        flow, cron, zone = body.get("flow"), body.get("cron"), body.get("timezone", "UTC")
        if not isinstance(flow, str) or not NAME.match(flow):
            raise ApiError(400, "invalid_schedule", "flow must name a flow (1-200 letters, digits and . _ : -)")
        catchup = body.get("catchup_secs", DEFAULT_CATCHUP_SECS)
        if type(catchup) not in (int, float) or not (math.isfinite(catchup) and 0 <= catchup <= MAX_CATCHUP_SECS):
            raise ApiError(400, "invalid_schedule", f"catchup_secs must be a number of seconds, 0 to {MAX_CATCHUP_SECS:.0f}")
        try:
            if not isinstance(zone, str):
                raise CronError("timezone must be a time zone's name (as 'UTC' or 'Europe/Berlin')")
            Cron(cron, zone)
        except CronError as exc:
            raise ApiError(400, "invalid_schedule", str(exc)) from None
        _check_size(body.get("input"), "input")
        queue = known_queue(self.gw.config, body)
        put = {"key": key, "tenant": tenant, "name": name, "flow": flow, "cron": cron, "timezone": zone,
               "input": body.get("input"), "catchup_secs": float(catchup)}
        if queue is not None:
            put["queue"] = queue
        reply = await self._ask(actor_name(key, self.gw.shards), Kind.SCHEDULE_PUT, put, session=key)
        return json_response(reply["schedule"], status=201 if reply.get("created") else 200)

    async def get(self, request: web.Request) -> web.Response:
        tenant, key, name = self._key(request)
        reply = await self._ask(actor_name(key, self.gw.shards), Kind.SCHEDULE_GET, {"key": key, "tenant": tenant},
                                session=key)
        if not reply["found"]:
            raise ApiError(404, "not_found", f"no schedule {name!r}")
        return json_response(reply["schedule"])

    async def delete(self, request: web.Request) -> web.Response:
        """The schedule starts nothing more; the runs it started go on."""
        tenant, key, name = self._key(request)
        reply = await self._ask(actor_name(key, self.gw.shards), Kind.SCHEDULE_DELETE,
                                {"key": key, "tenant": tenant}, session=key)
        if not reply["found"]:
            raise ApiError(404, "not_found", f"no schedule {name!r}")
        return web.Response(status=204)

    async def list(self, request: web.Request) -> web.Response:
        """The tenant's schedules by name (paged: `after` a name, `limit`)."""
        tenant = self.gw.tenant_of(request)
        limit = int_param(request, "limit", 100, 1, 1000)
        after = request.query.get("after", "")
        replies = await asyncio.gather(*(self._ask(f"actor/{i}", Kind.SCHEDULE_LIST, {"tenant": tenant})
                                         for i in range(self.gw.shards)))
        found = sorted((s for reply in replies for s in reply["schedules"] if s["name"] > after),
                       key=lambda s: s["name"])
        page = found[:limit]
        return json_response({"schedules": page, "next_after": page[-1]["name"] if len(found) > limit else None})
