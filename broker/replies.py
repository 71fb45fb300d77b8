"""Receiver-side de-duplication of requests (protocol.REQUESTS), for the bus client.

A request is sent again, with the same id, when its reply is late (broker/requests.py). The
receiver must not run it twice: it remembers each request it has seen, by (source, id), for
`DEDUPE_SECS`, and the reply it gave. A request seen again gets that reply again; one still being
handled is dropped (its reply is on its way); a read (protocol.READS) answered runs again.

Replies over CACHE_REPLY_MAX_BYTES are kept too, all of them together up to CACHE_BIG_BYTES; past
that a duplicate runs again. They were never kept, on the thought that only reads answer big, but
an attribute's update answers with its value: a reply the broker bounced to a requester stalled
past its peer timeout, or one that crossed the request's resend, ran the update twice.
"""
from __future__ import annotations

import collections
import time
from typing import Any

DEDUPE_SECS = 60.0
DEDUPE_MAX = 50_000
CACHE_REPLY_MAX_BYTES = 4096
CACHE_BIG_BYTES = 16 << 20
PENDING = object()   # request seen, reply not yet sent
RERUN = object()     # reply sent but not kept (the big ones' room was full): a duplicate runs again


class Replies:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], Any] = {}
        self._order: collections.deque[tuple[float, tuple[str, int]]] = collections.deque()
        self.big_bytes = 0   # of the kept replies over CACHE_REPLY_MAX_BYTES

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
            self._forget(key)
        elif key in self._seen:
            self._forget(key)    # (a second reply to one request replaces the first)
            size = len(envelope)
            if size <= CACHE_REPLY_MAX_BYTES:
                self._seen[key] = envelope
            elif self.big_bytes + size <= CACHE_BIG_BYTES:
                self._seen[key] = envelope
                self.big_bytes += size
            else:
                self._seen[key] = RERUN

    def expire(self, now: float, keep: int = DEDUPE_MAX) -> None:
        order = self._order
        while order and (now - order[0][0] > DEDUPE_SECS or len(order) > keep):
            self._forget(order.popleft()[1])

    def _forget(self, key: tuple[str, int]) -> None:
        cached = self._seen.pop(key, None)
        if type(cached) is bytes and len(cached) > CACHE_REPLY_MAX_BYTES:
            self.big_bytes -= len(cached)
