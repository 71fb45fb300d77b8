"""The newest checkpoint of each recently written session, in the gateway's memory.

The gateway is the one process that writes external runtimes' checkpoints (it appends them to the
log and answers once they are durable), so what it wrote last is, while it lives, exactly what a
read must return. Serving `GET …/checkpoints/latest` from here costs no bus message at all, and a
PUT no longer hands its payload on to the session's actor. A miss (a session not written since this
gateway started, or pushed out by the byte bound) reads the store once it has loaded what the
answer depends on, so the answer is the same either way. Holds only while there is a single
gateway process: a second one would have to route each session's checkpoints to one of them.

A miss depends on what was durable before this process started, and of what was written since,
only on the newest checkpoint of the session asked for, if it was pushed out: each pushed-out
session is remembered with where its checkpoint lies in the log (`needed`). So the store need
not catch up with the logs' ends first — which, under a burst of writes, is what a first read of
a new session waited on once the cache had pushed anything out: the usual read of a new task's
first step, on a server that has been running. With an 8 MB cache and every run on new agents,
remembering them gave 1.52x the checkpoints/s (bench/results/2026-12-03-new-sessions-small-cache-10k-ab/).
A session closed since is the exception (`closed`): the store's state at start still has its
checkpoints, so a miss on it reads with `sync` (the logs' ends), which includes the close.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

MAX_CLOSED = 100_000
MAX_GONE = 100_000      # pushed-out sessions remembered one by one; past it, by the furthest position
# What an entry costs beyond its payload (the dict slot, the tuple, the key strings): counted, or
# a million sessions of tiny checkpoints would pass the byte bound many times over unseen.
ENTRY_OVERHEAD_BYTES = 256




class Checkpoint(NamedTuple):
    key: str
    seq: int
    payload: bytes
    # (log, position) the log's end was at once it was durable; None: read from the store;
    # UNPLACED: acknowledged on receipt (durability `none`), before the log had a place for it
    where: tuple[int, int] | None = None


UNPLACED = (-1, -1)


def _cost(session: str, checkpoint: Checkpoint) -> int:
    return len(checkpoint.payload) + len(session) + len(checkpoint.key) + ENTRY_OVERHEAD_BYTES


class LatestCheckpoints:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: OrderedDict[str, Checkpoint] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.closed: set[str] = set()   # sessions closed while this process ran (see the docstring)
        self.gone: dict[str, tuple[int, int]] = {}   # pushed out: where its newest checkpoint lies
        self.floor: dict[int, int] = {}   # past MAX_GONE: the furthest position of those forgotten
        self.untracked = False            # every miss reads with `sync` (past MAX_CLOSED, or MAX_GONE of UNPLACED)

    def forget(self, session: str) -> None:
        """The session was closed: nothing of it is to be served from here or from the store's past."""
        old = self.entries.pop(session, None)
        if old is not None:
            self.bytes -= _cost(session, old)
        if len(self.closed) >= MAX_CLOSED:
            self.closed.clear()
            self.untracked = True
        self.closed.add(session)

    def needed(self, session: str) -> dict[int, int] | None:
        """How far the store must have loaded each log, beyond where the logs ended when this
        process started, to answer a miss on `session` with its newest checkpoint; None if only
        the logs' ends will do (a session closed since)."""
        if self.untracked or session in self.closed:
            return None
        need = dict(self.floor)
        where = self.gone.get(session)
        if where == UNPLACED:
            return None
        if where is not None:
            log, position = where
            need[log] = max(need.get(log, 0), position)
        return need

    def get(self, session: str) -> Checkpoint | None:
        found = self.hit(session)
        if found is None:
            self.misses += 1
        return found

    def hit(self, session: str) -> Checkpoint | None:
        """The session's newest checkpoint if held (counted as a hit); a miss is not counted, for a
        caller that goes on to `get` when there is none."""
        found = self.entries.get(session)
        if found is not None:
            self.hits += 1
            self.entries.move_to_end(session)
        return found

    def offer(self, session: str, checkpoint: Checkpoint) -> Checkpoint:
        """Keep `checkpoint` unless a newer one is known; returns the newest."""
        old = self.entries.get(session)
        if old is not None:
            if old.seq >= checkpoint.seq:
                return old
            self.bytes -= _cost(session, old)
        self.entries[session] = checkpoint
        self.entries.move_to_end(session)
        self.closed.discard(session)
        self.gone.pop(session, None)
        self.bytes += _cost(session, checkpoint)
        while self.bytes > self.max_bytes and self.entries:
            gone, evicted = self.entries.popitem(last=False)
            self.bytes -= _cost(gone, evicted)
            self.evicted += 1
            if evicted.where is not None:   # read from the store: the store has it already
                self._remember(gone, evicted.where)
        return checkpoint

    def _remember(self, session: str, where: tuple[int, int]) -> None:
        if len(self.gone) >= MAX_GONE:
            for log, position in self.gone.values():
                if (log, position) == UNPLACED:
                    self.untracked = True
                else:
                    self.floor[log] = max(self.floor.get(log, 0), position)
            self.gone.clear()
        self.gone[session] = where
