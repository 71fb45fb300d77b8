"""The access log: one durable row per HTTP request (method, route, status, tenant, duration).

Rows are ASYNC log records, so logging never delays a response; they wait in the gateway's
outbox if the log writer is slow, and are never dropped. The same middleware turns errors into
the JSON error shape (gateway/errors.py), so each request passes one middleware, not two.
"""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from agentos import metrics
from gateway.errors import errors_middleware
from storage.log_client import LogClient
from storage.records import RecordKind

CLIENT_CLOSED = 499


def access_middleware(log: LogClient | None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        started = time.monotonic()
        status = 500
        try:
            response = await errors_middleware(request, handler)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            info = request.match_info.route.resource
            record(log, request.method, info.canonical if info is not None else "unmatched", status,
                   request.get("tenant", ""), request.match_info.get("sid", ""), started)
    return middleware


def record(log: LogClient | None, method: str, route: str, status: int, tenant: str, session: str,
           started: float) -> None:
    """Count one answered request and append its access row (`started`: time.monotonic())."""
    metrics.inc(_requests_counter(route, status))
    if log is not None:
        body = {"at": time.time(), "method": method, "route": route, "status": status, "tenant": tenant,
                "session": session, "duration_ms": round((time.monotonic() - started) * 1000.0, 3)}
        log.append_nowait(RecordKind.ACCESS, body, session)


_COUNTERS: dict[tuple[str, int], object] = {}


def _requests_counter(route: str, status: int):
    """The labelled child, looked up once per (route, status) rather than per request."""
    child = _COUNTERS.get((route, status))
    if child is None:
        child = _COUNTERS[(route, status)] = metrics.http_requests.labels(route, str(status))
    return child
