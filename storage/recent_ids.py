"""The record ids a writer/log has written lately, so a re-sent record is written once.

A sender re-sends a record it got no ack for (its deadline passed, or the writer restarted before
answering), and a retry comes within that sender's deadline: an id older than `horizon_secs` only
costs memory, so ids are forgotten oldest first once they are that old or once more than `cap`
are kept (a steady load keeps a steady number of them). Never does: persistence — after a restart
the writer refills this from its log's tail (storage/segments.recent_ids).
"""
from __future__ import annotations

import collections

RECENT_IDS = 500_000      # hard cap on remembered record ids ...
DEDUPE_SECS = 60.0        # ... which are kept this long: twice a sender's append deadline (log_client)


class RecentIds:
    def __init__(self, horizon_secs: float = DEDUPE_SECS, cap: int = RECENT_IDS) -> None:
        self.horizon_secs = horizon_secs
        self.cap = cap
        self.ids: dict[bytes, float] = {}      # id -> when it was last written
        self.order: collections.deque[tuple[float, bytes]] = collections.deque()   # (when, id), oldest first

    def __contains__(self, record_id: bytes) -> bool:
        return record_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, record_id: bytes, now: float) -> None:
        self.ids[record_id] = now
        self.order.append((now, record_id))

    def discard(self, record_id: bytes) -> None:
        """Forget an id at once: its record was not written after all (a failed batch), so the
        sender's retry must get in."""
        self.ids.pop(record_id, None)

    def expire(self, now: float) -> None:
        order, ids, horizon = self.order, self.ids, now - self.horizon_secs
        while order and (order[0][0] < horizon or len(order) > self.cap):
            when, record_id = order.popleft()
            if ids.get(record_id) == when:     # not written again since (a retry of a failed batch)
                del ids[record_id]
