"""Sessions a gateway is closing, as their actor sees them.

A close is two steps apart in time: the actor stops the session (SESSION_CLOSE), then the gateway
appends the CLOSE record that names where the logs end (gateway/history.py). A turn that started
between the two would load the old history and write records on both sides of those ends: half of
it deleted with the session, half left to the id's next life. So from SESSION_CLOSE until the
gateway's SESSION_CLOSED a new turn on the session waits, and starts after the close, on an empty
session. The gateway sends SESSION_CLOSED until the actor takes it (one sent once was lost to an
actor stalled past the broker's peer timeout); should the gateway die in between, the hold ends by
itself after `HOLD_SECS`.

A fork into a session (actors/session_forks.py) holds its turns the same way, from before it
reads whether the session is empty until its checkpoint is durable, and ends its hold itself.
"""
from __future__ import annotations

import asyncio

HOLD_SECS = 15.0


class ClosingSessions:
    def __init__(self) -> None:
        self._holds: dict[str, tuple[list[object], asyncio.Event]] = {}

    def __contains__(self, sid: str) -> bool:
        return sid in self._holds

    def begin(self, sid: str) -> None:
        tokens, _ = self._holds.setdefault(sid, ([], asyncio.Event()))
        token = object()
        tokens.append(token)
        asyncio.get_running_loop().call_later(HOLD_SECS, self._end, sid, token)

    def hold(self, sid: str) -> "_Held":
        """A hold with no time limit, that its taker ends (`release`), whatever happens to it."""
        token = _Held()
        self._holds.setdefault(sid, ([], asyncio.Event()))[0].append(token)
        return token

    def release(self, sid: str, token: "_Held") -> None:
        self._end(sid, token)

    def end(self, sid: str) -> None:
        """The gateway is done with its oldest close of `sid` (appended, or given up)."""
        hold = self._holds.get(sid)
        closes = [token for token in hold[0] if not isinstance(token, _Held)] if hold is not None else []
        if closes:
            self._end(sid, closes[0])

    def _end(self, sid: str, token: object) -> None:
        hold = self._holds.get(sid)
        if hold is None or token not in hold[0]:
            return
        hold[0].remove(token)
        if not hold[0]:
            del self._holds[sid]
            hold[1].set()

    async def wait(self, sid: str) -> None:
        while (hold := self._holds.get(sid)) is not None:
            await hold[1].wait()


class _Held:
    """A hold's token that is not a close's (`end` passes it by)."""
