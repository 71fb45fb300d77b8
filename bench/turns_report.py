"""The report of a turn sweep: summary.md with its tables, and the PNG plots."""
from __future__ import annotations

from typing import Any

from bench import server_log
from bench.fsync_window import bound_text, zeroed_text
from bench.results import ResultsDir, markdown_table, pyplot

PROFILE_NAMES = {"core": "Agent OS, bare core (durability none)", "persist": "Agent OS, full persistence (local)",
                 "opencode": "opencode serve"}


def _profiles(rows: list[dict], peers: bool = True) -> list[str]:
    """The profiles with sweep points, ours first (core, persist, then variants as they came)."""
    seen = list(dict.fromkeys(r["profile"] for r in rows if "turns_per_sec" in r and r.get("kind") != "overload"
                              and r.get("profile") not in ("mock-direct", None)))
    ours = sorted((p for p in seen if p != "opencode"), key=lambda p: (p != "core", p != "persist"))
    return ours + (["opencode"] if peers and "opencode" in seen else [])


def _durable(rows: list[dict]) -> list[str]:
    """`persist` and its variants: the profiles priced against the bare core."""
    return [p for p in _profiles(rows, peers=False) if p.partition(":")[0] == "persist"]


def _name(profile: str) -> str:
    base, _, settings = profile.partition(":")
    return PROFILE_NAMES[profile] if profile in PROFILE_NAMES else f"{PROFILE_NAMES[base]}, {settings}"


def _points(rows: list[dict], profile: str, first_round: bool = False) -> list[dict]:
    """The sweep points of a profile, by concurrency then round (`first_round`: round 1 only)."""
    return sorted((r for r in rows if r.get("profile") == profile and "turns_per_sec" in r and
                   r.get("kind") != "overload" and not (first_round and r.get("round", 1) != 1)),
                  key=lambda r: (r["concurrency"], r.get("round", 1)))


def _ms(stats: dict | None, key: str) -> float | None:
    return (stats or {}).get(key)


def _errors(row: dict) -> int:
    return sum(v for k, v in row["counts"].items() if k not in ("ok", "rejected_429"))


def sweep_table(points: list[dict]) -> str:
    rounds = len({r.get("round", 1) for r in points}) > 1
    table = markdown_table(
        ["c", "turns/s", "TTFT p50 ms", "TTFT p99 ms", "turn p50 ms", "turn p95 ms", "turn p99 ms", "ok", "errors",
         "mock max conc.", "server CPU %", "loadgen CPU %", "tree private MiB"],
        [[r["concurrency"], r["turns_per_sec"], _ms(r["ttft_ms"], "p50"), _ms(r["ttft_ms"], "p99"),
          _ms(r["turn_ms"], "p50"), _ms(r["turn_ms"], "p95"), _ms(r["turn_ms"], "p99"), r["counts"]["ok"], _errors(r),
          r.get("mock_max_concurrent"), r.get("server_cpu_percent"), r.get("loadgen_cpu_percent"),
          round(r["server_private_dirty_kib"] / 1024, 1) if r.get("server_private_dirty_kib") else None]
         for r in points])
    if not rounds:
        return table
    # one more first column: the round
    lines = table.split("\n")
    head = ["| round " + lines[0], "|---:" + lines[1]]
    return "\n".join(head + [f"| {r.get('round', 1)} " + line for r, line in zip(points, lines[2:])])


def write_report(results: ResultsDir, rows: list[dict], args: Any) -> None:
    parts = [f"# Turn benchmark\n\nMock model: TTFT {args.mock_ttft_ms:g} ms, {args.mock_tps:g} tokens/s, "
             f"{args.mock_tokens} tokens. {args.warmup:g} s warm-up and {args.duration:g} s measured per point; "
             "closed loop, one session per worker; mock, server and load generator on the same machine "
             "(see config.json for the machine).\n"]
    direct = next((r for r in rows if r.get("profile") == "mock-direct"), None)
    if direct:
        parts.append(f"The mock on its own (median of {direct['turns']} sequential turns): TTFT "
                     f"{direct['ttft_ms']['p50']:.1f} ms, whole turn {direct['turn_ms']['p50']:.1f} ms.\n")
    for profile in _profiles(rows):
        parts.append(f"## {_name(profile)}\n\n{sweep_table(_points(rows, profile))}\n")
        points = _points(rows, profile, first_round=True)
        one = next((p for p in points if p["concurrency"] == 1), None)
        if one and direct and one["turn_ms"].get("p50"):
            added_turn = one["turn_ms"]["p50"] - direct["turn_ms"]["p50"]
            added = f"added over the mock at c=1: turn p50 +{added_turn:.1f} ms"
            if one["ttft_ms"].get("p50"):
                added += f", TTFT p50 +{one['ttft_ms']['p50'] - direct['ttft_ms']['p50']:.1f} ms"
            parts.append(added + ".\n")
        top = points[-1]
        if one and top is not one and one["turn_ms"].get("p50") and top["turn_ms"].get("p50"):
            parts.append(f"p50 at c={top['concurrency']} is {top['turn_ms']['p50'] - one['turn_ms']['p50']:+.1f} ms "
                         f"from c=1; {top['turns_per_sec']:.1f} turns/s.\n")
    cost = _persistence_cost(rows)
    if cost:
        parts.append(cost)
    warned = server_log.section([(f"{_name(r['profile'])}, c={r['concurrency']}, round {r.get('round', 1)}",
                                  r.get("server_log")) for p in _profiles(rows, peers=False) for r in _points(rows, p)],
                                "rounds")
    for section in (_log_batches(rows), _cpu_by_process(rows), _disk_by_round(rows), warned):
        if section:
            parts.append(section)
    side_by_side = _comparison(rows)
    if side_by_side:
        parts.append(side_by_side)
    memory = [r for r in rows if r.get("kind") == "memory"]
    if memory:
        parts.append("## Memory of idle sessions\n\nPrivate_Dirty of the whole server tree (every process), "
                     "after the sessions' turns ended and their turn buffers expired.\n\n" + markdown_table(
                         ["profile", "idle sessions", "tree private MiB", "per session KiB", "sessions resident"],
                         [[r["profile"], r["sessions"], round(r["private_dirty_kib"] / 1024, 1),
                           r.get("per_session_kib"), r.get("active_sessions")] for r in memory]) + "\n")
    over = next((r for r in rows if r.get("kind") == "overload"), None)
    if over:
        c = over["counts"]
        status = over.get("http_error_by_status") or {}
        five = sum(v for k, v in status.items() if str(k).startswith("5"))
        rejected = over.get("rejected_latency_ms") or {}
        parts.append(
            "## Overload (admission gate on: max_in_flight_turns 8, concurrency_limit 3, c=64)\n\n"
            f"- rejected with 429: {c['rejected_429']} (answered in p50 {rejected.get('p50') or 0:.1f} ms, "
            f"p99 {rejected.get('p99') or 0:.1f} ms)\n"
            f"- accepted turns completed: {c['ok']} (failed {c['failed']}, cancelled {c['cancelled']})\n"
            f"- 5xx responses: {five}; broken streams: {c['broken']}; timeouts: {c['timeout']}\n"
            f"- mock max concurrent streams: {over.get('mock_max_concurrent')} (limit 3)\n"
            f"- recovery after the load stopped: {over.get('recovery_secs')} s until a new turn completed\n")
    results.write_summary("\n".join(parts))
    _plots(results, rows)


def _persistence_cost(rows: list[dict]) -> str:
    """turns/s of each durable profile against the bare core at each concurrency (target at
    c=1000: persistence costs ≤ 5%), over every round; rounds alternate which profile ran first."""
    core = _points(rows, "core")
    durable = _durable(rows)
    lines = []
    for profile in durable:
        persist = _points(rows, profile)
        for c in sorted({r["concurrency"] for r in core} & {r["concurrency"] for r in persist}):
            a = [r for r in core if r["concurrency"] == c]
            b = [r for r in persist if r["concurrency"] == c]
            mean_a = sum(r["turns_per_sec"] for r in a) / len(a)
            mean_b = sum(r["turns_per_sec"] for r in b) / len(b)
            lines.append([profile, c, " / ".join(f"{r['turns_per_sec']:.1f}" for r in a),
                          " / ".join(f"{r['turns_per_sec']:.1f}" for r in b), round(mean_a, 1), round(mean_b, 1),
                          f"{round(100 * (1 - mean_b / mean_a), 1) + 0.0:.1f}%" if mean_a else None,
                          f"{sum(_errors(r) for r in a)} / {sum(_errors(r) for r in b)}"])
    if not lines:
        return ""
    rounds = max(r.get("round", 1) for r in rows if "turns_per_sec" in r)
    order = ("The profiles' servers stood side by side; at each concurrency every round ran each profile in turn, "
             "the order reversed each time. " if rounds > 1 else "")
    head = ["profile", "c", "core turns/s", "its turns/s", "core mean", "its mean", "persistence cost",
            "errors core / its"]
    if len(durable) == 1:   # the usual report: one durable profile, named in the head
        lines = [line[1:] for line in lines]
        head = ["c", "core turns/s", "persist turns/s", "core mean", "persist mean", "persistence cost",
                "errors core / persist"]
    return ("## What full persistence costs\n\n" + order + "Turns/s of each round, their mean, and how much "
            "less the persistence profile did (target at c=1000: ≤ 5%, nothing dropped).\n\n" +
            markdown_table(head, lines) + "\n")


def _log_batches(rows: list[dict]) -> str:
    """The persistence rounds' write + fdatasync of the log's batches over each measured window
    (bench/fsync_window.py): a slow round with slow batches is the disk's; with fast ones, ours."""
    points = [r for p in _durable(rows) for r in _points(rows, p) if r.get("log_fsync")]
    if not points:
        return ""

    lines = [[r["profile"], r["concurrency"], r.get("round", 1), r["turns_per_sec"], _ms(r["turn_ms"], "p95"),
              f["batches"], f.get("mean_ms"), bound_text(f.get("p50_le_ms")), bound_text(f.get("p99_le_ms")),
              bound_text(f.get("max_le_ms")), f.get("over_20ms"), f.get("over_100ms"),
              zeroed_text(f.get("zeroed")) if "zeroed" in f else "–", f.get("compacted", "–")]
             for r in points for f in [r["log_fsync"]]]
    return ("## The log's batches in each persistence round\n\nEvery log writer's batch write + fdatasync over "
            "the round's measured window, from the tree's `agentos_log_fsync_ms` histogram scraped at its "
            "start and end (percentiles are the bounds of the buckets they fell in), and what else the logs "
            "wrote meanwhile: segments zeroed (by when) and records compaction dropped. A batch over 500 ms "
            "is also a WARNING in the tree's log, with where its time went (storage/slow_batches.py).\n\n"
            + markdown_table(["profile", "c", "round", "turns/s", "turn p95 ms", "batches", "mean ms", "p50 ms",
                              "p99 ms", "slowest ms", "over 20 ms", "over 100 ms", "segments zeroed",
                              "records compacted"], lines) + "\n")


def _cpu_by_process(rows: list[dict]) -> str:
    """Each round's CPU by process of our trees, and the machine's: where persistence's CPU went,
    and whether the two cores were the limit."""
    points = [r for p in _profiles(rows, peers=False) for r in _points(rows, p) if r.get("server_cpu_by_process")]
    if not points:
        return ""
    names = sorted({name for r in points for name in r["server_cpu_by_process"]})
    lines = [[r["profile"], r["concurrency"], r.get("round", 1), r["turns_per_sec"], r.get("machine_busy_percent"),
              r.get("server_cpu_percent"), *(r["server_cpu_by_process"].get(n, 0.0) for n in names)] for r in points]
    return ("## Where the CPU went in each round (% of one core)\n\nOver each measured window: the whole "
            "machine (mock model and load generator included) and each process of the tree.\n\n" + markdown_table(
                ["profile", "c", "round", "turns/s", "machine busy", "tree", *names], lines) + "\n")


def _disk_by_round(rows: list[dict]) -> str:
    """Each round's writes: the device's (anyone's: the other tree's writeback too) and each of
    the tree's processes'. On a VM a cache flush makes the host persist whatever was written
    before it, so every MB here lengthens the log's fdatasyncs."""
    points = [r for p in _profiles(rows, peers=False) for r in _points(rows, p) if r.get("disk")]
    if not points:
        return ""
    names = sorted({name for r in points for name in r.get("server_written_mb_by_process") or {}})
    lines = [[r["profile"], r["concurrency"], r.get("round", 1), r["turns_per_sec"], r["disk"]["write_mb"],
              r["disk"]["writes"], r["disk"].get("write_ms"), r["disk"]["flushes"], r["disk"]["flush_ms"],
              r["disk"].get("discard_mb"), r["disk"].get("discard_ms"),
              *((r.get("server_written_mb_by_process") or {}).get(n, 0.0) for n in names)] for r in points]
    return (f"## What went to disk in each round\n\nOver each measured window, the device "
            f"({points[0]['disk']['device']}: every writer on it) and the MB each process of the tree had written "
            "(/proc/PID/io). The device's ms are summed over its requests, each from being queued to done: "
            "write ms far above the round's usual for its writes means writes waited (a stalled device), "
            "discards are the blocks deleted files gave back (ext4 mounted with `discard`).\n\n" + markdown_table(
                ["profile", "c", "round", "turns/s", "device MB", "device writes", "write ms", "cache flushes",
                 "flush ms", "discard MB", "discard ms", *(f"{n} MB" for n in names)], lines) + "\n")


def _comparison(rows: list[dict]) -> str:
    ours = {r["concurrency"]: r for r in _points(rows, "persist", first_round=True)}
    peer = {r["concurrency"]: r for r in _points(rows, "opencode")}
    if not ours or not peer:
        return ""
    table = markdown_table(
        ["c", "Agent OS turns/s", "Agent OS turn p50 ms", "opencode turns/s", "opencode turn p50 ms",
         "opencode errors"],
        [[c, ours.get(c, {}).get("turns_per_sec"), _ms(ours.get(c, {}).get("turn_ms"), "p50"),
          peer[c]["turns_per_sec"], _ms(peer[c]["turn_ms"], "p50"), _errors(peer[c])] for c in sorted(peer)])
    return ("## Agent OS (full persistence) and opencode, same mock, same sweep\n\n"
            "opencode persists to SQLite, so it is compared with the persistence profile.\n\n" + table + "\n")


def _plots(results: ResultsDir, rows: list[dict]) -> None:
    plt = pyplot()
    profiles = _profiles(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for profile in profiles:
        pts = _points(rows, profile, first_round=True)
        xs = [p["concurrency"] for p in pts]
        for key, style in (("p50", "-o"), ("p99", "--")):
            ys = [_ms(p["turn_ms"], key) for p in pts]
            axes[0].plot(xs, ys, style, label=f"{profile} turn {key}")
            ttft = [_ms(p["ttft_ms"], key) for p in pts]
            if any(t is not None for t in ttft):
                axes[1].plot(xs, ttft, style, label=f"{profile} TTFT {key}")
    for ax, title in ((axes[0], "whole turn time"), (axes[1], "time to first token")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions (closed loop)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(results.figure_path("latency.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    ideal = next((r for r in rows if r.get("profile") == "mock-direct"), None)
    for profile in profiles:
        pts = _points(rows, profile, first_round=True)
        ax.plot([p["concurrency"] for p in pts], [p["turns_per_sec"] for p in pts], "-o", label=profile)
    if ideal and profiles:
        xs = sorted({p["concurrency"] for pr in profiles for p in _points(rows, pr)})
        ax.plot(xs, [x * 1000.0 / ideal["turn_ms"]["p50"] for x in xs], ":", color="grey", label="mock's ideal")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("turns/s")
    ax.set_title("throughput")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(results.figure_path("throughput.png"), dpi=110)
    plt.close(fig)

    memory = [r for r in rows if r.get("kind") == "memory"]
    if memory:
        fig, ax = plt.subplots(figsize=(7, 5))
        for profile in sorted({r["profile"] for r in memory}):
            pts = sorted((r for r in memory if r["profile"] == profile), key=lambda r: r["sessions"])
            ax.plot([r["sessions"] for r in pts], [r["private_dirty_kib"] / 1024 for r in pts], "-o", label=profile)
        peer = _points(rows, "opencode")
        if peer:
            ax.plot([p["concurrency"] for p in peer], [p["server_private_dirty_kib"] / 1024 for p in peer], "-s",
                    label="opencode (peak during the sweep point)")
        ax.set_xlabel("sessions")
        ax.set_ylabel("private memory of the server tree, MiB")
        ax.set_title("memory vs sessions")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(results.figure_path("memory.png"), dpi=110)
        plt.close(fig)
