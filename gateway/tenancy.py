"""Tenants: what a tenant names is its own.

Session and run ids are namespaced per tenant at the edge: tenant `acme`'s session `s1` is
`acme~s1` inside the server, and another tenant's `s1` is a different session. So a tenant can
never read, resume, cancel, publish to or checkpoint what another created — it gets 404, and
learns nothing about whether the id exists elsewhere. The default tenant (no API keys
configured) keeps ids as they are.
"""
from __future__ import annotations

import re
import uuid

from agentos.tenant_ids import DEFAULT_TENANT, SEPARATOR, external, internal
from gateway.errors import ApiError

__all__ = ["DEFAULT_TENANT", "SEPARATOR", "internal", "external", "check_session_id", "new_session_id"]

TENANT_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")


def check_session_id(sid: str) -> str:
    if not SESSION_ID.match(sid):
        raise ApiError(400, "invalid_session_id",
                       "session id must be 1-128 characters of letters, digits and . _ : - (starting alphanumeric)")
    return sid


def new_session_id() -> str:
    return f"s{uuid.uuid4().hex}"


