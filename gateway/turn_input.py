"""What a turn is asked with (`POST /v1/sessions/{sid}/turns`): `input`, the user's message, and
optionally `system`, the turn's own instructions in place of `provider.system_prompt`."""
from __future__ import annotations

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
