"""Receiver-side de-duplication of requests (protocol.REQUESTS), for the bus client.

A request is sent again, with the same id, when its reply is late (broker/requests.py). The
receiver must not run it twice: it remembers each request it has seen, by (source, id), for
`DEDUPE_SECS`, and the reply it gave. A request seen again gets that reply again; one still being
handled is dropped (its reply is on its way); a read (protocol.READS) answered, or a request whose
reply was too big to keep, runs again (such replies answer reads, which may).
"""
from __future__ import annotations

import collections
import time
from typing import Any

DEDUPE_SECS = 60.0
DEDUPE_MAX = 50_000
CACHE_REPLY_MAX_BYTES = 4096
PENDING = object()   # request seen, reply not yet sent
RERUN = object()     # reply sent but too large to keep: a duplicate simply runs again


class Replies:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], Any] = {}
        self._order: collections.deque[tuple[float, tuple[str, int]]] = collections.deque()

    def first_time(self, key: tuple[str, int]) -> Any:
        """None the first time `key` is seen; else PENDING, RERUN or the reply envelope to send again."""
        cached = self._seen.get(key)
        if cached is None:
            self._seen[key] = PENDING
            self._order.append((time.monotonic(), key))
            if len(self._order) > DEDUPE_MAX:
                self.expire(float("inf"), keep=DEDUPE_MAX // 2)
        return cached

    def answered(self, key: tuple[str, int], envelope: bytes, keep: bool = True) -> None:
        """`keep` False: a read's reply; a duplicate from now on runs again, so the key goes too."""
        if not keep:
            self._seen.pop(key, None)
        elif key in self._seen:
            self._seen[key] = envelope if len(envelope) <= CACHE_REPLY_MAX_BYTES else RERUN

    def expire(self, now: float, keep: int = DEDUPE_MAX) -> None:
        order = self._order
        while order and (now - order[0][0] > DEDUPE_SECS or len(order) > keep):
            self._seen.pop(order.popleft()[1], None)
