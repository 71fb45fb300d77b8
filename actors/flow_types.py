"""What flow code meets besides `ctx` (actors/flow_context.py): the exceptions its operations
raise, a step's retry policy and its context, and the check of a value a run records.
actors/sdk.py re-exports these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import orjson

from broker.protocol import MAX_VALUE_BYTES


class StepFailed(Exception):
    """A step failed on its last attempt (or its retries were spent before a restart)."""


class NonDeterministic(Exception):
    """The flow asked for different operations on replay than when it first ran."""


class WaitTimeout(TimeoutError):
    """`ctx.wait` reached its timeout without a message."""


class ChildFailed(Exception):
    """A child flow ended without completing."""


class SendFailed(Exception):
    """`ctx.send`'s target run does not exist (for this tenant) or has ended."""


class Suspended(BaseException):
    """Internal: the run waits for a timer, a message or a child; this execution ends here."""


class Superseded(BaseException):
    """Internal: another execution of the run took over; this one stops without a trace."""


@dataclass(frozen=True)
class Retry:
    """Attempts of a step (across restarts: each attempt is journaled) and back-off between them."""
    max_attempts: int = 3
    backoff_secs: float = 0.1
    multiplier: float = 2.0
    max_backoff_secs: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:   # 0 ran an ASYNC step never
            raise ValueError(f"Retry.max_attempts must be an int of at least 1, got {self.max_attempts!r}")
        if min(self.backoff_secs, self.max_backoff_secs) < 0 or self.multiplier < 1:
            raise ValueError("Retry: back-offs must not be negative and the multiplier at least 1")

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff_secs, self.backoff_secs * self.multiplier ** max(0, attempt - 1))


NO_RETRY = Retry(max_attempts=1)


@dataclass
class StepContext:
    """Given to a step function that takes a `step` keyword: its attempt and heartbeats."""
    attempt: int
    last_heartbeat: Any
    _beat: Callable[[Any], None]

    def heartbeat(self, value: Any = None) -> None:
        """Report progress; `value` is what the next attempt sees as `last_heartbeat`."""
        self._beat(value)


def check_encodable(value: Any, what: str, json: bool = False) -> None:
    """Refuse, with an error that says why, a value a run cannot record (see MAX_VALUE_BYTES);
    `json`: one read back over HTTP too (a flow's result, an attribute), where bytes cannot go."""
    try:
        size = len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be msgpack-serialisable (dict, list, str, bytes, numbers, bool, None): "
                        f"{exc}") from None
    if json:
        try:
            orjson.dumps(value)
        except TypeError as exc:
            raise TypeError(f"{what} must be JSON-serialisable (it is read over HTTP as JSON): {exc}") from None
    if size > MAX_VALUE_BYTES:
        raise ValueError(f"{what} is {size:,} bytes as msgpack; a run records values of at most "
                         f"{MAX_VALUE_BYTES:,} bytes")
