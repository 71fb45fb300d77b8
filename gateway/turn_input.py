"""What a turn is asked with (`POST /v1/sessions/{sid}/turns`): `input`, the user's message, and
optionally `system`, the turn's own instructions in place of `provider.system_prompt`; and its
`Idempotency-Key`, which names its turn id: a start sent again with the key streams the turn the
first one began (from its first event), rather than beginning another."""
from __future__ import annotations

import hashlib

from gateway.errors import ApiError


def turn_input(body: dict, max_chars: int) -> tuple[str, str | None]:
    """(input, system) of a turn's body; ApiError if either is not a string or they are too long."""
    text = body.get("input")
    if not isinstance(text, str) or not text:
        raise ApiError(400, "invalid_input", "body must have a non-empty string field 'input'")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, "invalid_system", "'system' must be a string: this turn's instructions")
    if len(text) + len(system or "") > max_chars:
        raise ApiError(413, "input_too_large", f"input over {max_chars} characters")
    return text, system


def keyed_turn_id(request, tenant: str, sid: str) -> str | None:
    """The turn id an `Idempotency-Key` names in this session (`k` and 24 hex digits), or None."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not 0 < len(key) <= 200:
        raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-200 characters")
    return "k" + hashlib.sha1(f"{tenant}|{sid}|{key}".encode()).hexdigest()[:24]
