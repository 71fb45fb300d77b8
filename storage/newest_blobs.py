"""Where each session's newest external checkpoint lies in the payload segments, in writer/store's
memory: `GET …/checkpoints/latest` for a session the gateway's cache has pushed out is answered
by one read of the payload, not by a query.

Such a read was a scan of the checkpoints table by session (DuckDB makes no index lookup of it),
3.5 ms at the median beside a 10k burst, and the reads queued behind each other on the one query
thread: the first read of each task, on sessions written a run before, took 7-8 ms at the median
and 53-99 ms at the p99 (by hand, 1 MB gateway cache).

An entry is served only when it is `sure`: known to be the session's newest of every row in
DuckDB. The loader, after each commit, puts every session's newest of the batch: sure if it is
the session's first external checkpoint (the Bloom filter says none was loaded before; a false
"maybe" only costs the fast path), else not — rows from before this process started, pushed out
of this map, or whose entry a payload compaction or a close removed may hold a higher seq. Such
an entry becomes sure once a query has answered for the session (`answered`): the query saw every
row committed before it ran, and every load committed after it has put its row here (the loader
puts after its commit), so the higher of the two is the newest. An entry removed
between the query and `answered` (pushed out by the bound, or its session closed) could hide a
load or a deletion the query did not see: an answer is not taken if any was removed meanwhile.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import NamedTuple

MAX_SESSIONS = 50_000   # about 22 MB at most (440 bytes an entry: its tuple, numbers, strings)


class Newest(NamedTuple):
    tenant: str
    key: str
    seq: int
    at: int          # place in the payload segments (storage/payload_segments.py)
    length: int
    sure: bool
    writer: int = -1   # the row's log and position: a payload compaction moves it by them
    lsn: int = -1


class NewestBlobs:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self.entries: OrderedDict[str, Newest] = OrderedDict()
        self.removals = 0
        self.lock = threading.Lock()   # the loader, the query thread and a close change it

    def get(self, session: str) -> Newest | None:
        """The session's newest external checkpoint, if known for sure."""
        found = self.entries.get(session)
        return found if found is not None and found.sure else None

    def loaded(self, row: tuple, first: bool) -> None:
        """The loader committed `row` of the checkpoints table (storage/projection.py, its payload
        placed: `…, writer, lsn, at, length`), its session's newest of the batch; `first`: no
        external checkpoint of the session was loaded before it (as far as the Bloom filter knows)."""
        session, tenant, _, key, seq = row[:5]
        with self.lock:
            old = self.entries.get(session)
            if old is None:   # not sure unless the first: older rows may be newer (a clock set back)
                sure = first
            elif seq > old.seq:
                sure = old.sure
            else:
                return
            self._put(session, Newest(sys.intern(tenant), key, seq, row[11], row[12], sure, row[9], row[10]))

    def answered(self, session: str, row: Newest, removals: int) -> None:
        """A query found `row` the session's newest, having started when `removals` entries had
        been removed."""
        with self.lock:
            if self.removals != removals:
                return
            old = self.entries.get(session)
            if old is not None and old.seq >= row.seq:
                self.entries[session] = old._replace(sure=True)
            else:
                self._put(session, row._replace(tenant=sys.intern(row.tenant), sure=True))

    def forget(self, session: str) -> None:
        """The session's rows are being deleted (closed)."""
        with self.lock:
            self.entries.pop(session, None)
            self.removals += 1

    def moved(self, begin: int, end: int, moves: dict[tuple[int, int], int]) -> int:
        """A payload compaction rewrote the payloads in [begin, end): each row it kept, by (writer,
        lsn), is at its new place; an entry in the range it did not keep goes (none should: a
        session's newest is kept). How many entries moved."""
        with self.lock:
            placed = [(s, entry) for s, entry in self.entries.items() if begin <= entry.at < end]
            for session, entry in placed:
                new_at = moves.get((entry.writer, entry.lsn))
                if new_at is None:
                    del self.entries[session]
                    self.removals += 1
                else:
                    self.entries[session] = entry._replace(at=new_at)
        return len(placed)

    def _put(self, session: str, entry: Newest) -> None:
        self.entries[session] = entry   # callers intern its tenant: one string per tenant
        self.entries.move_to_end(session)
        while len(self.entries) > self.max_sessions:
            self.entries.popitem(last=False)
            self.removals += 1
