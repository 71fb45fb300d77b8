"""When to restart a child that died: capped exponential back-off with jitter, and crash loops.

A plain function of the restart history, so it is tested without any process.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    base_secs: float = 0.1
    cap_secs: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.2              # +/- this fraction of the delay
    stable_secs: float = 30.0        # a run this long resets the back-off
    loop_restarts: int = 5           # this many restarts ...
    loop_window_secs: float = 60.0   # ... within this window is a crash loop


def restart_delay(policy: RestartPolicy, consecutive_failures: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before restart number `consecutive_failures` (1 = the first)."""
    if consecutive_failures < 1:
        return 0.0
    delay = min(policy.cap_secs, policy.base_secs * policy.multiplier ** (consecutive_failures - 1))
    spread = delay * policy.jitter
    return max(0.0, delay + (rng or random).uniform(-spread, spread))


def next_failure_count(policy: RestartPolicy, previous: int, ran_secs: float) -> int:
    """The consecutive-failure count after a child that ran `ran_secs` died."""
    return 1 if ran_secs >= policy.stable_secs else previous + 1


def is_crash_loop(policy: RestartPolicy, restart_times: list[float], now: float) -> bool:
    recent = [t for t in restart_times if now - t <= policy.loop_window_secs]
    return len(recent) >= policy.loop_restarts
