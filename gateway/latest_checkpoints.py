"""The newest checkpoint of each recently written session, in the gateway's memory.

The gateway is the one process that writes external runtimes' checkpoints (it appends them to the
log and answers once they are durable), so what it wrote last is, while it lives, exactly what a
read must return. Serving `GET …/checkpoints/latest` from here costs no bus message at all, and a
PUT no longer hands its payload on to the session's actor. A miss (a session not written since this
gateway started, or pushed out by the byte bound) reads the store with `sync`, which includes every
acknowledged write, so the answer is the same either way. Holds only while there is a single
gateway process: a second one would have to route each session's checkpoints to one of them.

While nothing has been pushed out (`evicted` is 0), a miss needs only what was durable before
this process started: everything written since is here. So the store need not catch up with the
log's end first — which, under a burst of writes, is what a first read of a new session waited on.
A session closed since is the exception (`closed`): the store's state at start still has its
checkpoints, so a miss on it reads with `sync`, which includes the close.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

MAX_CLOSED = 100_000
# What an entry costs beyond its payload (the dict slot, the tuple, the key strings): counted, or
# a million sessions of tiny checkpoints would pass the byte bound many times over unseen.
ENTRY_OVERHEAD_BYTES = 256




class Checkpoint(NamedTuple):
    key: str
    seq: int
    payload: bytes


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

    def forget(self, session: str) -> None:
        """The session was closed: nothing of it is to be served from here or from the store's past."""
        old = self.entries.pop(session, None)
        if old is not None:
            self.bytes -= _cost(session, old)
        if len(self.closed) >= MAX_CLOSED:   # past this, every miss reads with `sync`
            self.closed.clear()
            self.evicted += 1
        self.closed.add(session)

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
        self.bytes += _cost(session, checkpoint)
        while self.bytes > self.max_bytes and self.entries:
            gone, evicted = self.entries.popitem(last=False)
            self.bytes -= _cost(gone, evicted)
            self.evicted += 1
        return checkpoint
