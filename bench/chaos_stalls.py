"""The chaos bench's stalls (`--stall-every`): a random role of the tree stopped with SIGSTOP for
2-6 s, then SIGCONT — a process that is slow rather than dead, as a VM's pause, swapping or a
long GC makes one. Its peers time it out (the bus declares a peer dead after 3 s of silence) and
it wakes to a world that moved on: nothing it acknowledged may be lost, no stream may hang.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time

from bench.server_proc import ServerProcess

STALL_SECS = (2.0, 6.0)


async def staller(server: ServerProcess, every: float, rng: random.Random, stop: asyncio.Event, stalls: list[dict],
                  t0: float, roles: list[str]) -> None:
    """Until `stop`: every `every` seconds or so (jittered ±50%), one role stopped for STALL_SECS;
    each stall is appended to `stalls` (seconds from `t0`). A stalled process is always continued,
    also when the run stops in the middle of its stall."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every * rng.uniform(0.5, 1.5))
            return
        except asyncio.TimeoutError:
            pass
        try:
            pids = server.pids()
        except (OSError, ValueError):
            continue
        names = sorted(name for name in pids if name != "supervisor" and (not roles or name in roles))
        if not names:
            continue
        role, secs = rng.choice(names), rng.uniform(*STALL_SECS)
        try:
            os.kill(pids[role], signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stalls.append({"t": round(time.monotonic() - t0, 2), "role": role, "pid": pids[role], "secs": round(secs, 2)})
        print(f"  {stalls[-1]['t']:7.1f}s  SIGSTOP {role} (pid {pids[role]}) for {secs:.1f}s", file=sys.stderr)
        try:
            await asyncio.wait_for(stop.wait(), secs)
        except asyncio.TimeoutError:
            pass
        finally:
            try:
                os.kill(pids[role], signal.SIGCONT)
            except ProcessLookupError:
                pass
