"""Closed sessions leave the log: the compaction pass over their records (storage/session_closing.py).

The store names where a log held records of sessions closed since (`closed_records`, by the
positions it loaded them at, or skipped them at). A segment keeps its start position as its name
through rewrites, so a position still says which segment; inside it, earlier rewrites may have
moved the record, so it is found by its session and its time: every record of the session from
before the close (`at` no later than it) goes. Only sealed segments the store has loaded and the
bucket has received, as for the other passes; the rest wait for a later pass.
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from agentos import metrics
from broker.protocol import Kind
from broker.sharding import STORE
from storage.compaction import read_mark, rewrite_segment, sealed_segments, store_refused

if TYPE_CHECKING:
    from storage.log_writer import LogWriter


async def drop_closed(writer: "LogWriter", ready: int) -> int:
    """One pass: rewrite the segments holding records of closed sessions; returns records dropped."""
    # Not past the segments the superseded-checkpoint pass is done with: it finds records by the
    # positions the store loaded them at, which a rewrite here would move.
    reach = min(ready, read_mark(writer.directory))
    reply = await writer.bus.request(STORE, Kind.STORE_CLOSED, {"writer": writer.index, "end": reach}, timeout=60.0)
    if store_refused(writer, reply, "which records belong to closed sessions") or not reply.body["rows"]:
        return 0
    sealed = [seg for seg in sealed_segments(writer.directory) if seg[1] <= reach]
    starts = [start for start, _, _ in sealed]
    named: dict[int, dict[str, float]] = {}   # segment index -> {session: closed at}
    for position, session, closed_at in reply.body["rows"]:
        i = bisect.bisect_right(starts, int(position)) - 1
        if i >= 0 and int(position) < sealed[i][1]:
            sessions = named.setdefault(i, {})
            sessions[str(session)] = max(float(closed_at), sessions.get(str(session), 0.0))
    dropped = 0
    for i, sessions in sorted(named.items()):
        start, end, path = sealed[i]
        count = await rewrite_segment(writer, start, end, path, {"closed": sessions})
        dropped += count
        reply = await writer.bus.request(STORE, Kind.STORE_FORGET_CLOSED,
                                         {"writer": writer.index, "start": start, "end": end}, timeout=60.0)
        if store_refused(writer, reply, f"forgetting the closed sessions' records of {path.name}"):
            break   # the store names them again next pass; a second rewrite finds nothing to drop
    if dropped:
        metrics.compacted_records.labels("closed_session").inc(dropped)
        writer.log.info("compaction: dropped %d records of closed sessions", dropped)
    return dropped
