"""The record ids a writer/log has written lately, so a re-sent record is written once.

A sender re-sends a record it got no ack for (its deadline passed, or the writer restarted before
answering), and a retry comes within that sender's deadline: an id older than `horizon_secs` only
costs memory, so ids are forgotten once they are that old or once more than `cap` are kept (a
steady load keeps a steady number of them). Never does: persistence — after a restart the writer
refills this from its log's tail (storage/segments.recent_ids).

Ids are kept in a few generations, each a set filled for a quarter of the horizon (or a quarter
of the cap) and dropped whole once its newest id is past the horizon: an id costs its bytes and a
set slot, ~90 bytes, where an entry in a dict plus a (time, id) queue cost ~185, and a dropped
generation hands its memory back at once. A writer restarted on a busy log refills up to the cap
(500k ids): ~43 MB more than a fresh one in the chaos runs, and a dict that kept its size after
the ids aged out.
"""
from __future__ import annotations

import collections

RECENT_IDS = 500_000      # hard cap on remembered record ids ...
DEDUPE_SECS = 60.0        # ... which are kept this long: twice a sender's append deadline (log_client)
GENERATIONS = 4           # a generation spans this fraction of the horizon and of the cap


class _Generation:
    __slots__ = ("started", "newest", "ids")

    def __init__(self, now: float) -> None:
        self.started = now
        self.newest = now
        self.ids: set[bytes] = set()


class RecentIds:
    def __init__(self, horizon_secs: float = DEDUPE_SECS, cap: int = RECENT_IDS) -> None:
        self.horizon_secs = horizon_secs
        self.cap = cap
        self.span = horizon_secs / GENERATIONS
        self.per_generation = max(1, cap // GENERATIONS)
        self.generations: collections.deque[_Generation] = collections.deque()   # oldest first

    def __contains__(self, record_id: bytes) -> bool:
        for generation in self.generations:
            if record_id in generation.ids:
                return True
        return False

    def __len__(self) -> int:
        return sum(len(g.ids) for g in self.generations)

    def add(self, record_id: bytes, now: float) -> None:
        generations = self.generations
        if (not generations or now - generations[-1].started >= self.span
                or len(generations[-1].ids) >= self.per_generation):
            generations.append(_Generation(now))
        newest = generations[-1]
        newest.ids.add(record_id)
        newest.newest = now

    def discard(self, record_id: bytes) -> None:
        """Forget an id at once: its record was not written after all (a failed batch), so the
        sender's retry must get in."""
        for generation in self.generations:
            generation.ids.discard(record_id)

    def expire(self, now: float) -> None:
        generations = self.generations
        while generations and now - generations[0].newest > self.horizon_secs:
            generations.popleft()
        while len(generations) > 1 and len(self) > self.cap:
            generations.popleft()
