"""The access log: one durable row per HTTP request (method, route, status, tenant, duration).

Rows are ASYNC, so logging never delays a response, and they go to the log many to a record:
with a record per row, each checkpoint PUT put two records through the log (and a GET one), each
framed, checksummed, written and loaded into DuckDB on its own. A record takes the rows of
`LINGER_SECS` or `ROWS_PER_RECORD` rows, whichever comes first; once appended, it waits in the
gateway's outbox if the log writer is slow and is never dropped. The same middleware turns
errors into the JSON error shape (gateway/errors.py), so each request passes one middleware, not
two.
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


def access_middleware(access: AccessLog):
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
            access.record(request.method, info.canonical if info is not None else "unmatched", status,
                          request.get("tenant", ""), request.match_info.get("sid", ""), started)
    return middleware


ROWS_PER_RECORD = 512
LINGER_SECS = 0.02


class AccessLog:
    """Gathers access rows and appends them to the log as one ACCESS record per batch."""

    def __init__(self, log: LogClient | None) -> None:
        self.log = log
        self.rows: list[list] = []
        self.timer: asyncio.TimerHandle | None = None

    def record(self, method: str, route: str, status: int, tenant: str, session: str, started: float) -> None:
        """Count one answered request and keep its row (`started`: time.monotonic())."""
        metrics.inc(_requests_counter(route, status))
        if self.log is None:
            return
        now = time.monotonic()
        self.rows.append([time.time(), method, route, status, tenant, session, round((now - started) * 1000.0, 3)])
        if len(self.rows) >= ROWS_PER_RECORD:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(LINGER_SECS, self.flush)

    def flush(self) -> None:
        """Append the rows gathered so far (at shutdown too, before the log client drains)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.rows and self.log is not None:
            rows, self.rows = self.rows, []
            self.log.append_nowait(RecordKind.ACCESS, {"at": rows[-1][0], "rows": rows}, "")


_COUNTERS: dict[tuple[str, int], object] = {}


def _requests_counter(route: str, status: int):
    """The labelled child, looked up once per (route, status) rather than per request."""
    child = _COUNTERS.get((route, status))
    if child is None:
        child = _COUNTERS[(route, status)] = metrics.http_requests.labels(route, str(status))
    return child
