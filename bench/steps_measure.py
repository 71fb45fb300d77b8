"""What the step benchmark measures with: the closed loop of clients and how it counts work in its
window, and samples of the server's /metrics (the PUTs it made, an idle node's requests)."""
from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any, Awaitable, Callable

PUTS = 'agentos_s3_requests_total{op="put",purpose="wal"}'


def _metric_lines(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return resp.read().decode().splitlines()


def scrape(url: str, name: str) -> float:
    """One sample of /metrics, by its exact name and labels (0 if absent)."""
    return next((float(line.split()[-1]) for line in _metric_lines(url) if line.startswith(name + " ")), 0.0)


def scrape_family(url: str, name: str) -> dict[str, float]:
    """Every sample of a metric on /metrics: its labels as written (`op="put",purpose="wal"`) -> value."""
    out = {}
    for line in _metric_lines(url):
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) + 1:].rpartition("} ")
            out[labels] = float(value)
    return out


def idle_requests(url: str, secs: float) -> dict[str, Any]:
    """Object-storage requests per second of a node with nothing to do, by operation and purpose."""
    before = scrape_family(url, "agentos_s3_requests_total")
    time.sleep(secs)
    after = scrape_family(url, "agentos_s3_requests_total")
    rates = {k: round((after[k] - before.get(k, 0.0)) / secs, 3) for k in sorted(after)
             if after[k] > before.get(k, 0.0)}
    return {"system": "idle", "idle_secs": secs, "requests_per_sec": rates,
            "puts_per_sec": round(sum(v for k, v in rates.items() if 'op="put"' in k), 3)}


async def closed_loop(fn: Callable[[int, int], Awaitable[float | None]], clients: int, warmup: float,
                      duration: float) -> tuple[int, list[float], int, float, float]:
    """(operations that ended in the window, their latencies ms, errors, window secs, work in the
    window). Counted by end time, as the Restate peer's load counts: an operation begun before the
    window still counts once. `work` instead counts each operation by the share of its span that
    fell inside the window (the last ones, begun before the window closed, are awaited), so a
    10-step flow that straddles an edge counts for part: with many clients started together, whole
    flows end in waves, and counting them by end time swings by a wave's worth."""
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup
    end = start + duration
    latencies: list[float] = []
    counts = [0, 0]
    work = [0.0]

    async def client(index: int) -> None:
        n = 0
        while loop.time() < end:
            began = loop.time()
            try:
                measured = await fn(index, n)
            except Exception:  # counted; the loop goes on, as a client would
                if start <= loop.time() < end:
                    counts[1] += 1
                await asyncio.sleep(0.05)
                continue
            finished = loop.time()
            n += 1
            inside = min(finished, end) - max(began, start)
            if inside > 0:
                work[0] += inside / (finished - began)
            if start <= finished < end:
                counts[0] += 1
                latencies.append(measured if measured is not None else (finished - began) * 1000.0)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return counts[0], latencies, counts[1], duration, work[0]
