"""What a load run measured, summarised: attempt records, percentiles, the window report.

Owns: the `Attempt` record, the classes an attempt can end in, nearest-rank percentiles, and the
report numbers of one measured window (counts, rates, latency percentiles, error samples, the
load generator's own CPU). Never does: I/O, timing, or deciding what an attempt's class is.

Percentiles use the nearest-rank method (the smallest sample with at least p% of the samples at
or below it) rather than interpolation: every reported value is one that was actually measured,
and p99 of a small sample is plainly its maximum instead of a point between the two largest.
No numpy: this module is imported by the load generator, which must stay small in memory.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

KINDS = ("ok", "rejected_429", "failed", "cancelled", "http_error", "broken", "timeout")
QUANTILES = (50, 95, 99)


class Attempt:
    """One request's outcome. Times are perf_counter() seconds; first_delta is None if no delta."""

    __slots__ = ("kind", "start", "first_delta", "end", "status", "message", "connect_failed")

    def __init__(self, kind: str, start: float, first_delta: float | None, end: float,
                 status: int = 0, message: str | None = None, connect_failed: bool = False):
        self.kind, self.start, self.first_delta, self.end = kind, start, first_delta, end
        self.status, self.message, self.connect_failed = status, message, connect_failed


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence; 0 < pct <= 100."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {pct}")
    rank = math.ceil(pct / 100 * len(sorted_values))  # 1-based
    return sorted_values[max(rank, 1) - 1]


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """p50/p95/p99/mean/max/n of `values`; the statistics are None when there are no samples."""
    n = len(values)
    if n == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None, "n": 0}
    ordered = sorted(values)
    out: dict[str, float | int | None] = {
        f"p{q}": round(percentile(ordered, q), digits) for q in QUANTILES
    }
    out["mean"] = round(math.fsum(ordered) / n, digits)
    out["max"] = round(ordered[-1], digits)
    out["n"] = n
    return out


def window_report(attempts: Sequence[Attempt], window_start: float, window_end: float,
                  grace_secs: float, cpu_secs: float, max_samples: int = 10) -> dict:
    """The numbers of one measured window.

    Counted: attempts that start inside [window_start, window_end) and end by window_end +
    grace_secs. Rates divide by the window length. CPU per turn divides the CPU spent inside the
    window by the attempts that *ended* inside it, which is the work that CPU actually paid for.
    Error samples come from all attempts, warm-up included: an early error is still worth seeing.
    """
    window = window_end - window_start
    if window <= 0:
        raise ValueError("empty measurement window")
    last_end = window_end + grace_secs
    counted = [a for a in attempts if window_start <= a.start < window_end and a.end <= last_end]
    counts = dict.fromkeys(KINDS, 0)
    by_status: dict[str, int] = {}
    for a in counted:
        counts[a.kind] += 1
        if a.kind == "http_error":
            by_status[str(a.status)] = by_status.get(str(a.status), 0) + 1
    ok = [a for a in counted if a.kind == "ok"]
    rejected = [a for a in counted if a.kind == "rejected_429"]
    ended = [a for a in attempts if window_start <= a.end < window_end]
    ok_ended = sum(1 for a in ended if a.kind == "ok")
    samples: list[dict] = []
    seen: set[tuple[str, str | None]] = set()
    for a in sorted(attempts, key=lambda a: a.end):
        if a.kind != "ok" and (a.kind, a.message) not in seen and len(samples) < max_samples:
            seen.add((a.kind, a.message))
            samples.append({"kind": a.kind, "status": a.status, "message": a.message})
    return {
        "window_secs": round(window, 3),
        "counts": counts,
        "attempts": len(counted),
        "http_error_by_status": by_status,
        "turns_per_sec": round(len(ok) / window, 3),
        "attempts_per_sec": round(len(counted) / window, 3),
        "ttft_ms": summarize([(a.first_delta - a.start) * 1000 for a in ok
                              if a.first_delta is not None]),
        "turn_ms": summarize([(a.end - a.start) * 1000 for a in ok]),
        "rejected_latency_ms": summarize([(a.end - a.start) * 1000 for a in rejected]),
        "error_samples": samples,
        "loadgen_cpu": {
            "cpu_seconds": round(cpu_secs, 4),
            "cpu_percent_of_one_core": round(100 * cpu_secs / window, 2),
            "cpu_ms_per_turn": round(1000 * cpu_secs / max(len(ended), 1), 4),
            "cpu_ms_per_ok_turn": round(1000 * cpu_secs / max(ok_ended, 1), 4),
            "attempts_ended_in_window": len(ended),
        },
    }


def summary_text(report: dict) -> str:
    """A few human lines for stdout; the JSON report has everything."""
    cfg, cpu = report["config"], report["loadgen_cpu"]

    def ms(s: dict) -> str:
        return "-" if not s["n"] else f"p50 {s['p50']:.1f} p95 {s['p95']:.1f} p99 {s['p99']:.1f}"

    by_status = report["http_error_by_status"]
    return "\n".join([
        f"{cfg['target']} {cfg['url']} concurrency={cfg['concurrency']} "
        f"window={report['window_secs']}s: {report['turns_per_sec']} ok turns/s, "
        f"{report['attempts_per_sec']} attempts/s",
        "  " + " ".join(f"{k}={v}" for k, v in report["counts"].items())
        + (f" by_status={by_status}" if by_status else ""),
        f"  ttft ms: {ms(report['ttft_ms'])} | turn ms: {ms(report['turn_ms'])} | "
        f"429 ms: {ms(report['rejected_latency_ms'])}",
        f"  loadgen cpu: {cpu['cpu_percent_of_one_core']}% of a core, "
        f"{cpu['cpu_ms_per_turn']} ms/attempt",
    ] + [f"  error: {s['kind']} {s['message']}" for s in report["error_samples"][:3]])
