"""The numbers and the record of the checkpoint benchmark: windows, the table, ratios, the plot.

Owns: the per-window p99 of commit latencies (10-second windows as in the reference article, and
1-second windows when a run is too short for three full 10-second ones), the markdown summary
(one row per run, agentos/pgredis ratios per scale × mode, first-insert vs overwrite, the disk
floor) and the PNG of windowed p99 over time. Never does: run anything or time anything.

Window rule: a commit belongs to the window in which it *completed* (when its latency became
known, as a metrics histogram would see it), measured from the start of the run. Only full
windows count; the trailing partial window is left out (its commits are in the overall p99).
A full window in which no commit completed is counted as `empty` — a stall at least a window
long, whose commits land, late, in a later window's p99 — and has no p99 of its own.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench import cpu_speed, server_log
from bench.checkpoint_compare import compare_table
from bench.fsync_window import bound_text, zeroed_text
from bench.results import markdown_table, pyplot
from bench.stats import percentile

COLUMNS = ("target", "scale", "mode", "checkpoints", "duration s", "checkpoints/s",
           "commit p50 ms", "commit p99 ms", "task p99 ms", "median window p99 ms",
           "worst window p99 ms", "disk MB")


def window_p99s(end_secs: Sequence[float], latencies_ms: Sequence[float], window_secs: float,
                duration_secs: float) -> list[dict]:
    """p99 of the latencies of each full window [k·w, (k+1)·w) by completion time."""
    if window_secs <= 0:
        raise ValueError(f"window_secs must be > 0, got {window_secs}")
    if len(end_secs) != len(latencies_ms):
        raise ValueError("end_secs and latencies_ms differ in length")
    full = int(duration_secs // window_secs)
    buckets: list[list[float]] = [[] for _ in range(full)]
    for end, latency in zip(end_secs, latencies_ms):
        k = int(end // window_secs)
        if 0 <= k < full:
            buckets[k].append(latency)
    out = []
    for k, bucket in enumerate(buckets):
        bucket.sort()
        out.append({"start_secs": round(k * window_secs, 3),
                    "end_secs": round((k + 1) * window_secs, 3), "n": len(bucket),
                    "p99_ms": round(percentile(bucket, 99), 3) if bucket else None})
    return out


def window_summary(windows: list[dict], window_secs: float) -> dict:
    """Median (nearest rank) and worst of the windows' p99s."""
    p99s = sorted(w["p99_ms"] for w in windows if w["p99_ms"] is not None)
    return {
        "window_secs": window_secs,
        "full_windows": len(windows),
        "empty_windows": sum(1 for w in windows if w["p99_ms"] is None),
        "median_p99_ms": percentile(p99s, 50) if p99s else None,
        "worst_p99_ms": p99s[-1] if p99s else None,
        "series": [[w["end_secs"], w["p99_ms"], w["n"]] for w in windows],
    }


def window_report(end_secs: Sequence[float], latencies_ms: Sequence[float], duration_secs: float,
                  window_secs: float = 10.0, fine_window_secs: float = 1.0,
                  min_windows: int = 3) -> dict:
    """The 10 s windows, plus the 1 s ones when there are fewer than `min_windows` full 10 s
    windows; `used` names the one the table shows."""
    coarse = window_summary(window_p99s(end_secs, latencies_ms, window_secs, duration_secs),
                            window_secs)
    out = {"by_window": {_label(window_secs): coarse}, "used": _label(window_secs)}
    if coarse["full_windows"] < min_windows:
        fine = window_summary(window_p99s(end_secs, latencies_ms, fine_window_secs,
                                          duration_secs), fine_window_secs)
        out["by_window"][_label(fine_window_secs)] = fine
        out["used"] = _label(fine_window_secs)
    return out


def _label(window_secs: float) -> str:
    return f"{window_secs:g}s"


# ----------------------------------------------------------------------------------- the table
def _used(row: dict) -> tuple[dict, str]:
    windows = row["windows"]
    return windows["by_window"][windows["used"]], windows["used"]


def _window_cell(value: float | None, label: str, default_label: str) -> object:
    if value is None:
        return None
    if label == default_label:
        return value
    return f"{value:.1f} ({label})" if value >= 10 else f"{value:.2f} ({label})"


def _mode_cell(row: dict, repeats: int) -> str:
    cell = row["mode"] if repeats <= 1 else f"{row['mode']} R{row['run']}"
    return cell if "round" not in row else f"{cell} #{row['round']}"   # a --compare round


def _p50_p99(summary: dict | None) -> str | None:
    if not summary or not summary.get("n"):
        return None
    return f"{summary['p50']:.2f} / {summary['p99']:.2f}"


def table_rows(rows: list[dict], repeats: int = 1, default_window: str = "10s") -> list[list]:
    out = []
    for r in rows:
        used, label = _used(r)
        out.append([r["target"], r["scale"], _mode_cell(r, repeats), r["checkpoints"],
                    r["duration_secs"], r["checkpoints_per_sec"], r["commit_ms"]["p50"],
                    r["commit_ms"]["p99"], r["task_ms"]["p99"],
                    _window_cell(used["median_p99_ms"], label, default_window),
                    _window_cell(used["worst_p99_ms"], label, default_window), r.get("disk_mb")])
    return out


PEERS = ("pgredis", "langgraph")   # what our server is set against, each in a table of its own


def ratios(rows: list[dict], ours: str = "agentos", peer: str = "pgredis") -> list[dict]:
    """Per (scale, mode): ours/peer throughput (> 1: we are faster) and commit p99 (< 1: we are
    better); each side's median over its repeats (the mean of the middle two for an even count:
    a ratio of summaries, not a measured value)."""
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["checkpoints"]:
            by[(r["target"], r["scale"], r["mode"])].append(r)
    out = []
    for (target, scale, mode), mine in by.items():
        theirs = by.get((peer, scale, mode))
        if target != ours or not theirs:
            continue
        tp = statistics.median([r["checkpoints_per_sec"] for r in mine])
        tp_peer = statistics.median([r["checkpoints_per_sec"] for r in theirs])
        p99 = statistics.median([r["commit_ms"]["p99"] for r in mine])
        p99_peer = statistics.median([r["commit_ms"]["p99"] for r in theirs])
        out.append({"scale": scale, "mode": mode,
                    "throughput_ratio": round(tp / tp_peer, 3) if tp_peer else None,
                    "commit_p99_ratio": round(p99 / p99_peer, 3) if p99_peer else None})
    return out


LAYERS = ("noop-http", "agentos-none", "fsync-http", "agentos")


def _floors(config: dict) -> list[dict]:
    """The disk floors of a run: `disk_floors`, or the single `disk_floor` of older configs."""
    return config.get("disk_floors") or ([config["disk_floor"]] if config.get("disk_floor") else [])


def layer_table(rows: list[dict], config: dict) -> str | None:
    """Per (scale, mode, workers): each layer's median commit p50 and checkpoints/s, then the disk
    floors' p50; None unless a layer target beside `agentos` ran."""
    if not {r["target"] for r in rows} & set(LAYERS[:3]):
        return None
    floors = _floors(config)
    by: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["target"] in LAYERS and r["checkpoints"]:
            by[(r["scale"], r["mode"], r["workers"])][r["target"]].append(r)
    lines = []
    for (scale, mode, workers), targets in by.items():
        cells = []
        for layer in LAYERS:
            runs = targets.get(layer)
            cells.append(f"{statistics.median(r['commit_ms']['p50'] for r in runs):.2f} "
                         f"({statistics.median(r['checkpoints_per_sec'] for r in runs):,.0f}/s)" if runs else "–")
        lines.append([scale, mode, workers, *cells, *(f"{f['p50_ms']:.3f}" for f in floors)])
    return markdown_table(["scale", "mode", "workers", *(f"{t} p50 ms" for t in LAYERS),
                           *(f"floor {f['block_bytes']} B p50 ms" for f in floors)], lines)


def _phase_table(rows: list[dict]) -> str | None:
    """Runs of one (target, scale, mode) that differ in how many keys already existed."""
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["target"], r["scale"], r["mode"])].append(r)
    lines = []
    for (target, scale, mode), group in by.items():
        if len({r["phase"] for r in group}) < 2:
            continue
        for r in group:
            lines.append([target, scale, mode, r["run"], r["phase"], r["checkpoints_per_sec"],
                          r["commit_ms"]["p99"]])
    if not lines:
        return None
    return markdown_table(["target", "scale", "mode", "run", "phase", "checkpoints/s",
                           "commit p99 ms"], lines)


def summary_markdown(rows: list[dict], config: dict) -> str:
    repeats = int(config.get("bench", {}).get("repeat", 1))
    parts = ["# Checkpoint writes", "",
             (f"{config.get('bench', {}).get('workers')} workers; payload 2 KB + 2 KB per task, "
              "capped at 64 KB; commit = the durable write the agent waits for; task = read "
              "latest + commit in mixed mode. Window p99: commits by completion time; values "
              "marked (1s) are over 1-second windows because the run had fewer than 3 full "
              "10-second windows."), "",
             markdown_table(COLUMNS, table_rows(rows, repeats))]
    bench = config.get("bench", {})
    if bench.get("warm_up_mb"):
        parts[3:3] = [(f"Before its first run each target took a warm-up burst of {bench['warm_up_mb']} MB of "
                       f"checkpoints on agents of their own (not measured), then {bench['warm_up_idle_secs']:g} s "
                       "of rest: a store that has been running, not one just created."), ""]
    errors = [f"- {r['target']} {r['scale']} {r['mode']} R{r['run']}: {r['errors']}"
              + (f" reads: {r['reads']}" if r.get("read_anomalies") else "")
              for r in rows if r["errors_total"] or r.get("read_anomalies")]
    if errors:
        parts += ["", "Errors (not counted in the latencies):", *errors]
    compared = compare_table(rows)
    if compared:
        spec = config.get("compare") or {}
        parts += ["", f"## Side by side: {spec.get('key', 'one config key')}", "",
                  ("Each round started one fresh tree per value, so the arms alternated: odd rounds "
                   "in the order listed, even rounds in reverse (`#n` in the table above is the "
                   "round). Medians over the rounds; "
                   "\"vs first\" is the arm's median over the first arm's; \"rounds ahead\" counts "
                   "the rounds in which the arm did more checkpoints/s than the first arm did in "
                   "the same round."), "", compared]
    for peer in PEERS:
        ratio_rows = ratios(rows, peer=peer)
        if ratio_rows:
            parts += ["", f"## agentos vs {peer}", "",
                      (f"throughput ratio = agentos / {peer} checkpoints/s (> 1: agentos faster); "
                       f"commit p99 ratio = agentos / {peer} (< 1: agentos lower)."), "",
                      markdown_table(["scale", "mode", "throughput ratio", "commit p99 ratio"],
                                     [[r["scale"], r["mode"], r["throughput_ratio"],
                                       r["commit_p99_ratio"]] for r in ratio_rows])]
    probed = [r for r in rows if r.get("disk_floor_p50_ms")]
    if probed:
        size = (config.get("floor_each_run") or {}).get("block_bytes", "?")
        parts += ["", "## Commit p50 against the disk floor of the same minute", "",
                  (f"The floor ({size} B append + fdatasync, p50) taken again just before each run "
                   "(`--floor-each-run`): this disk's speed drifts by the minute, so each run is set "
                   "against its own."), "",
                  markdown_table(["target", "scale", "mode", "commit p50 ms", "floor p50 ms", "ratio"],
                                 [[r["target"], r["scale"], _mode_cell(r, repeats), r["commit_ms"]["p50"],
                                   r["disk_floor_p50_ms"],
                                   (round(r["commit_ms"]["p50"] / r["disk_floor_p50_ms"], 2)
                                    if r["commit_ms"]["p50"] else "–")] for r in probed])]
    timed = [r for r in rows if r.get("parts_ms")]
    if timed:
        names = list(dict.fromkeys(n for r in timed for n in r["parts_ms"]))
        parts += ["", "## Each store's share of an op (p50 / p99 ms)", "",
                  ("The reference article's \"Postgres commit p99\" is `pg_upsert` alone; the "
                   "commit columns above are PostgreSQL + Redis, what the agent waits for."), "",
                  markdown_table(["target", "scale", "mode", *names],
                                 [[r["target"], r["scale"], _mode_cell(r, repeats),
                                   *(_p50_p99(r["parts_ms"].get(n)) for n in names)]
                                  for r in timed])]
    cpu = [r for r in rows if r.get("cpu_percent_of_core")]
    if cpu:
        parts += ["", "## Where the CPU went (% of one core)", "",
                  ("`other` is busy CPU that was neither this client nor the target's server "
                   "processes (kernel work, other load): a high value means the run was "
                   "disturbed. `–`: the server's processes were not known."), "",
                  markdown_table(["target", "scale", "mode", "cores", "client", "server",
                                  "other", "machine busy"],
                                 [[r["target"], r["scale"], _mode_cell(r, repeats),
                                   r["cpu_percent_of_core"].get("cores"),
                                   r["cpu_percent_of_core"].get("client"),
                                   r["cpu_percent_of_core"].get("server"),
                                   r["cpu_percent_of_core"].get("other"),
                                   r["cpu_percent_of_core"].get("machine_busy")] for r in cpu])]
    batches = [r for r in rows if (r.get("log_fsync") or {}).get("batches")]
    if batches:
        parts += ["", "## The log's batches in each run", "",
                  ("Our server's batch write + fdatasync over the run (every log of the tree: the "
                   "gateway's own and writer/log's), from its `agentos_log_fsync_ms` histogram read "
                   "before and after; percentiles are the bounds of the buckets they fell in. A commit "
                   "waits for its batch and, arriving during one, for the batch before it. Segments "
                   "zeroed: the log segments written full of zeros meanwhile "
                   "(`agentos_log_segments_zeroed_total`, by when); records compacted: what "
                   "compaction dropped from the log meanwhile (`agentos_compacted_records_total`; a "
                   "pass rewrites whole sealed segments). Both write to the disk the commits flush "
                   "to."), "",
                  markdown_table(["target", "scale", "mode", "commit p99 ms", "batches", "mean ms", "p50 ms",
                                  "p99 ms", "slowest ms", "over 5 ms", "over 20 ms", "segments zeroed",
                                  "records compacted"],
                                 [[r["target"], r["scale"], _mode_cell(r, repeats), (r.get("commit_ms") or {}).get("p99"),
                                   f["batches"], f["mean_ms"], bound_text(f["p50_le_ms"]), bound_text(f["p99_le_ms"]),
                                   bound_text(f["max_le_ms"]), f.get("over_5ms"), f["over_20ms"],
                                   zeroed_text(f.get("zeroed")) if "zeroed" in f else "–",
                                   f.get("compacted", "–")]
                                  for r in batches for f in [r["log_fsync"]]])]
    warned = server_log.section([(f"{r['target']} {r['scale']} {_mode_cell(r, repeats)}", r.get("server_log"))
                                 for r in rows])
    if warned:
        parts += ["", warned]
    phases = _phase_table(rows)
    if phases:
        parts += ["", "## First insert vs overwrite", "", phases]
    layers = layer_table(rows, config)
    if layers:
        parts += ["", "## Where a commit's time goes", "",
                  ("Each row: commit p50 (checkpoints/s) of one target at the same scale, mode and "
                   "workers. `noop-http` answers the same routes and does nothing else (the client "
                   "and one HTTP exchange); `agentos-none` is our whole process tree with "
                   "`storage.durability: none` (no fsync); `fsync-http` is the do-nothing server "
                   "group-committing each PUT body to a file before answering (the floor of a durable "
                   "server in one Python process); `agentos` is the durable server. The "
                   "disk floors are single appends + fdatasync of that many bytes, no HTTP."), "",
                  layers]
    wakeup = config.get("wakeup_round_trip")
    if wakeup:
        limit = config.get("cpu_latency_us")
        held = ("idle CPUs held to wake within "
                f"{limit} µs (/dev/cpu_dma_latency) for the whole run, every target alike" if limit is not None
                else "CPU idle states as the machine left them")
        parts += ["", "## Waking up", "",
                  f"A byte passed back and forth between two processes over pipes, n={wakeup['n']}: round trip "
                  f"p50 {wakeup['p50_us']:.1f} µs, p99 {wakeup['p99_us']:.1f} µs; {held}. Every hop between "
                  "client, server processes and disk pays a wakeup (bench/cpu_idle.py)."]
    cpu = config.get("python_workload")
    if cpu:
        parts += cpu_speed.section(cpu)
    floors = _floors(config)
    if floors:
        dev = floors[0].get("device", {})
        parts += ["", "## Disk floor", ""]
        parts += [(f"{floor['block_bytes']} B append + fdatasync, n={floor['n']}, in "
                   f"{floor['directory']} ({dev.get('source', '?')} on {dev.get('mount', '?')}):"
                   f" p50 {floor['p50_ms']:.3f} ms, p99 {floor['p99_ms']:.3f} ms, "
                   f"mean {floor['mean_ms']:.3f} ms, max {floor['max_ms']:.3f} ms.") for floor in floors]
        after = config.get("disk_floor_after")
        if after:
            parts += [f"Again after the runs, {after['block_bytes']} B: p50 {after['p50_ms']:.3f} ms, "
                      f"p99 {after['p99_ms']:.3f} ms (the disk's speed drifts: a ratio to the floor is only "
                      "as good as the two agree)."]
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------ the plot
def plot_windows(rows: list[dict], path: Path) -> Path | None:
    """Windowed commit p99 over time: one panel per scale × mode, one line per target (run)."""
    panels = list(dict.fromkeys((r["scale"], r["mode"]) for r in rows))  # in run order
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.8 * len(panels)), squeeze=False)
    repeats = max(r["run"] for r in rows)
    for ax, (scale, mode) in zip(axes[:, 0], panels):
        labels = set()
        for r in rows:
            if (r["scale"], r["mode"]) != (scale, mode):
                continue
            used, label = _used(r)
            labels.add(label)
            points = [(t, p) for t, p, _ in used["series"] if p is not None]
            name = r["target"] + _mode_cell(r, repeats)[len(r["mode"]):]
            if points:
                ax.plot([t for t, _ in points], [p for _, p in points], marker=".", label=name)
        ax.set_title(f"{scale} · {mode} — commit p99 per {'/'.join(sorted(labels))} window")
        ax.set_xlabel("seconds since run start")
        ax.set_ylabel("p99 ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no full window: the run was shorter than one window",
                    ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

