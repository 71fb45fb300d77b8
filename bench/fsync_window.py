"""What the write-ahead log's fdatasyncs did over a window of a benchmark: two scrapes of a running
tree's `agentos_log_fsync_ms` histogram (every log writer of the tree, summed by /metrics) and
their difference — with what else wrote to the same disk meanwhile: the log segments zeroed
(`agentos_log_segments_zeroed_total`, by when) and the records compaction dropped.

Why: a benchmark point that ran slow with persistence on and not without it is either our code or
the disk; the batches' write + fdatasync times over that very window tell which. The histogram's
buckets bound the percentiles (a p99 "≤ 20 ms" means the 99th batch fell in the bucket ending at
20 ms), which is all a stall needs to show. The tree's processes publish their metrics once a
second (agentos/service.py), so a snapshot taken under load is up to a second behind; between
runs, `settled_snapshot` waits that second out first.
"""
from __future__ import annotations

import asyncio
import math
import urllib.request

METRIC = "agentos_log_fsync_ms"
ZEROED = "agentos_log_segments_zeroed_total"
COMPACTED = "agentos_compacted_records_total"
PUBLISH_SECS = 1.1   # each process writes its metrics out every second


def snapshot(url: str, timeout: float = 5.0) -> dict | None:
    """The histogram now: {"buckets": {le: cumulative count}, "sum": ms, "count": n}; None if the
    tree did not answer (a benchmark goes on without it)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return parse(text)


async def settled_snapshot(url: str | None) -> dict | None:
    """A snapshot once every process has published what it did until now (idle tree: exact);
    with no URL (a target without our metrics), only the same pause."""
    await asyncio.sleep(PUBLISH_SECS)
    return await asyncio.get_running_loop().run_in_executor(None, snapshot, url) if url else None


def parse(text: str) -> dict:
    buckets: dict[float, float] = {}
    zeroed: dict[str, float] = {}
    total = count = compacted = 0.0
    for line in text.splitlines():
        if line.startswith(ZEROED + "{"):
            name, _, value = line.rpartition(" ")
            zeroed[name.split('when="', 1)[1].split('"', 1)[0]] = float(value)
            continue
        if line.startswith(COMPACTED + "{"):
            compacted += float(line.rpartition(" ")[2])
            continue
        if not line.startswith(METRIC):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith(METRIC + "_bucket{"):
            le = name.split('le="', 1)[1].split('"', 1)[0]
            buckets[math.inf if le == "+Inf" else float(le)] = float(value)
        elif name == METRIC + "_sum":
            total = float(value)
        elif name == METRIC + "_count":
            count = float(value)
    return {"buckets": buckets, "sum": total, "count": count, "zeroed": zeroed, "compacted": compacted}


def delta(before: dict | None, after: dict | None) -> dict | None:
    """The batches between two snapshots: how many, their mean, the bucket bounds of their p50,
    p99 and slowest, and how many took over 5, 20 and 100 ms; and the segments zeroed (by when)
    and records compacted between them."""
    if before is None or after is None:
        return None
    count = int(after["count"] - before["count"])
    # segments zeroed meanwhile, by when (agentos/metrics.py): the disk writes that compete most
    zeroed = {when: int(n - before.get("zeroed", {}).get(when, 0.0)) for when, n in after.get("zeroed", {}).items()}
    zeroed = {when: n for when, n in zeroed.items() if n > 0}
    # …and records compaction dropped meanwhile: each pass rewrites whole sealed segments
    compacted = int(after.get("compacted", 0.0) - before.get("compacted", 0.0))
    if count <= 0:
        return {"batches": 0, "zeroed": zeroed, "compacted": compacted}
    between = {le: after["buckets"][le] - before["buckets"].get(le, 0.0) for le in sorted(after["buckets"])}

    def bound(rank: float) -> float | None:
        le = next((le for le, n in between.items() if n >= rank), None)
        return None if le is None or math.isinf(le) else le

    def over(ms: float) -> int:
        return int(count - between.get(ms, count))

    slowest = next((le for le, n in between.items() if n >= count), math.inf)
    return {"batches": count, "mean_ms": round((after["sum"] - before["sum"]) / count, 3),
            "p50_le_ms": bound(0.5 * count), "p99_le_ms": bound(0.99 * count),
            "max_le_ms": None if math.isinf(slowest) else slowest,
            "over_5ms": over(5.0), "over_20ms": over(20.0), "over_100ms": over(100.0), "zeroed": zeroed,
            "compacted": compacted}


def zeroed_text(zeroed: dict | None) -> str:
    """Segments zeroed in a window as a table shows them: "ahead 3, at_rotation 1", or "0"."""
    return ", ".join(f"{when} {n}" for when, n in sorted((zeroed or {}).items())) or "0"


def bound_text(bound: float | None) -> str:
    """A percentile's bucket bound as a table shows it: "≤ 20", or "–" past the last bucket."""
    return "–" if bound is None else f"≤ {bound:g}"
