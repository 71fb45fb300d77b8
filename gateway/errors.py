"""The HTTP error shape, `{"error": {"code", "message"}}`, and the middleware that enforces it.

aiohttp's own 404/405/413 answers are plain text; the middleware turns them into the JSON shape,
and an unexpected exception into a 500 with a log line rather than a dropped connection.
"""
from __future__ import annotations

import logging

import orjson
from aiohttp import web

log = logging.getLogger("agent-os.gateway")

_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
          413: "body_too_large", 415: "unsupported_media_type", 429: "overloaded", 503: "unavailable"}


# What a refused log write (storage/write_failures.py names its codes) answers over HTTP.
LOG_WRITE_ERRORS = {"disk_full": (507, "insufficient_storage"), "io_error": (503, "storage_error")}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_body(code: str, message: str) -> bytes:
    """The error shape's bytes (also written by gateway/fast_path.py, which has no web.Response)."""
    return orjson.dumps({"error": {"code": code, "message": message}})


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(code, message), content_type="application/json",
                        headers=headers)


def json_response(data, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json", headers=headers)


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter `name` as an integer in [low, high], `default` if absent; else a 400."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "invalid_parameter", f"{name} must be an integer") from None
    if not low <= value <= high:
        raise ApiError(400, "invalid_parameter", f"{name} must be between {low} and {high}")
    return value


async def errors_middleware(request: web.Request, handler):
    """Run the handler; every error becomes the JSON error shape (called by the access middleware)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODES.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason or code, {k: v for k, v in exc.headers.items()
                                                                     if k.lower() in ("allow", "retry-after")})
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal error")
