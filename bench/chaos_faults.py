"""The chaos bench's faults besides its kills (bench/chaos.py), each a task that runs until the
kills stop:

- stalls (`--stall-every`): a random role of the tree stopped with SIGSTOP for 2-6 s, then
  SIGCONT — a process that is slow rather than dead, as a VM's pause, swapping or a long GC makes
  one. Its peers time it out (the bus declares a peer dead after 3 s of silence) and it wakes to a
  world that moved on: nothing it acknowledged may be lost, no stream may hang;
- outages of the bucket (`--bucket-outages`): the fault proxy in front of moto (bench/s3_local.py)
  refuses connections or answers 503 for 2-4 s.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time

from bench.s3_local import FaultyProxy
from bench.server_proc import ServerProcess

STALL_SECS = (2.0, 6.0)
OUTAGE_SECS = (2.0, 4.0)


async def stopped_within(stop: asyncio.Event, secs: float) -> bool:
    """Wait `secs`, or less if `stop` is set meanwhile; whether it was."""
    try:
        await asyncio.wait_for(stop.wait(), secs)
        return True
    except asyncio.TimeoutError:
        return False


async def staller(server: ServerProcess, every: float, rng: random.Random, stop: asyncio.Event, stalls: list[dict],
                  t0: float, roles: list[str]) -> None:
    """Until `stop`: every `every` seconds or so (jittered ±50%), one role stopped for STALL_SECS
    (one of `roles`, or any but the supervisor); each stall is appended to `stalls` (seconds from
    `t0`). A stalled process is always continued, also when the run stops in the middle of its
    stall."""
    while not await stopped_within(stop, every * rng.uniform(0.5, 1.5)):
        try:
            pids = server.pids()
        except (OSError, ValueError):
            continue
        # the supervisor only when named: stopped, it renews no lease and restarts nobody
        names = sorted(name for name in pids if name in roles or (not roles and name != "supervisor"))
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
            await stopped_within(stop, secs)
        finally:
            try:
                os.kill(pids[role], signal.SIGCONT)
            except ProcessLookupError:
                pass


async def outager(proxy: FaultyProxy, every: float, rng: random.Random, stop: asyncio.Event, log: list[dict],
                  t0: float) -> None:
    """Until `stop`: every `every` seconds or so (jittered ±50%), the bucket away for OUTAGE_SECS,
    its connections refused or answered 503; each outage is appended to `log` (seconds from `t0`)."""
    while not await stopped_within(stop, every * rng.uniform(0.5, 1.5)):
        mode, secs = rng.choice(("refuse", "503")), rng.uniform(*OUTAGE_SECS)
        log.append({"t": round(time.monotonic() - t0, 2), "secs": round(secs, 2), "mode": mode})
        print(f"  {log[-1]['t']:7.1f}s  the bucket {mode} for {secs:.1f}s", file=sys.stderr)
        proxy.set(mode)
        try:
            await stopped_within(stop, secs)
        finally:
            proxy.set("up")
