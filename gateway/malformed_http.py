"""Requests aiohttp cannot parse: a 400, a short log line now and then, a count and an access row.

aiohttp answers a malformed request (a header line without a colon, two Content-Lengths, a
Content-Length beside Transfer-Encoding, bytes that are not HTTP) with 400 itself, and logs it
through its server logger at ERROR with a full traceback — one per request, so any client or
port scanner could fill the server's log at will, and such requests were in neither the access
log nor `agentos_http_requests_total`. `ServerLog` is the logger aiohttp's request handler is
given instead: a client's malformed request becomes an access row of route `malformed` (and is
counted like any request), and the log gets at most one WARNING line per `LOG_EVERY_SECS`,
saying how many it left out. Everything else aiohttp logs — an exception of ours while answering — keeps its
traceback.
"""
from __future__ import annotations

import logging
import time

from aiohttp.http_exceptions import HttpProcessingError

from gateway.access import AccessLog

ROUTE = "malformed"
LOG_EVERY_SECS = 60.0


class ServerLog:
    """Stands in for aiohttp's `aiohttp.server` logger (it calls only `debug` and `exception`)."""

    def __init__(self, log: logging.Logger, access: AccessLog) -> None:
        self.log = log
        self.access = access
        self.server_log = logging.getLogger("aiohttp.server")
        self.left_out = 0
        self.last_logged = float("-inf")

    def debug(self, msg, *args, **kwargs) -> None:
        # aiohttp logs the first request of a connection that is not HTTP at all here (TLS or
        # a scanner on the port): counted, not logged
        if _a_clients_fault(kwargs.get("exc_info")):
            self._count(kwargs["exc_info"])
        self.server_log.debug(msg, *args, **kwargs)

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        if not _a_clients_fault(exc_info):
            self.server_log.exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        self._count(exc_info)
        now = time.monotonic()
        if now - self.last_logged < LOG_EVERY_SECS:
            self.left_out += 1
            return
        more = f" ({self.left_out} more since the last such line)" if self.left_out else ""
        self.log.warning("malformed HTTP request answered %d: %s%s", exc_info.code, _first_line(exc_info), more)
        self.last_logged, self.left_out = now, 0

    def _count(self, exc: HttpProcessingError) -> None:
        self.access.record("-", ROUTE, exc.code, "", "", time.monotonic())


def _a_clients_fault(exc) -> bool:
    return isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500


def _first_line(exc: HttpProcessingError) -> str:
    # aiohttp's message spans lines: the reason, the bytes, a caret under the bad one
    text = " ".join(word for word in str(exc.message).split() if word != "^")
    return text[:200]
