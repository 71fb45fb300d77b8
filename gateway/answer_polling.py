"""Keeping the gateway's loop awake for a moment after a checkpoint answer.

A loop asleep in epoll is woken by the client's next request: a wakeup the client's send pays for
and the request waits on — tens of µs where idle CPUs halt, as in a VM. While a callback is
pending, uvloop polls its sockets with a zero timeout instead of sleeping, so a request that
follows an answer at once (read latest, then commit; one step's write after another) is read
without one. `gateway.poll_after_answer_usecs` bounds it: an idle gateway sleeps again that long
after its last answer. Measured against no polling (bench/results/2026-12-03-poll-after-answer-*):
one worker's commit p50 about 40-50 µs lower; at 10k, 1.29× the write checkpoints/s and less
server CPU per checkpoint, since a loop that no longer sleeps between batches no longer pays for
going to sleep and being woken.

Each poll also yields the CPU (`sched_yield`: returns at once when nothing else is runnable
there). The kernel wakes a client on the CPU of the process that answered it (a socket write is a
"sync" wakeup: the waker is assumed to sleep next), so a client on the same machine often lands
on the gateway's CPU — and waited out a polling gateway's time slice (per-task scheduling delays
by `perf sched`: of the benchmark client's waits over 0.2 ms, nine in ten were on the gateway's
CPU, behind the gateway). Yielding at each poll, eight rounds at 10k
(bench/results/2026-12-03-poll-yield-10k-ab, -2): mixed 1.04× and 1.11× the checkpoints/s at
0.80× and 0.69× the commit p99, write even (1.12×, 0.88×); one worker 1.04× / 1.08×.
"""
from __future__ import annotations

import asyncio
import os
import time


class AnswerPolling:
    def __init__(self, secs: float) -> None:
        self.secs = secs
        self.loop: asyncio.AbstractEventLoop | None = None   # set once the server runs on one
        self._answered_at = 0.0
        self._polling = False

    def answered(self) -> None:
        if not self.secs or self.loop is None:
            return
        self._answered_at = time.perf_counter()
        if not self._polling:
            self._polling = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        if time.perf_counter() - self._answered_at < self.secs:
            os.sched_yield()
            self.loop.call_soon(self._poll)
        else:
            self._polling = False
