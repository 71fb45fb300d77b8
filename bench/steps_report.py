"""The report of a step benchmark: summary.md with the table, and a PNG bar chart."""
from __future__ import annotations

from typing import Any

from bench import cpu_speed
from bench.results import ResultsDir, markdown_table, pyplot


PEER_LABELS = {"restate": "Restate", "dbos": "DBOS"}


def write_report(results: ResultsDir, rows: list[dict], args: Any, reference: dict, targets: dict,
                 cpu: dict | None = None) -> None:
    peers = {name: {(r["scenario"], r["clients"]): r for r in rows if r["system"] == name} for name in PEER_LABELS}
    peers = {name: points for name, points in peers.items() if points}
    modes = args.durability.split(",")
    by_mode = {m: [r for r in rows if r["system"] == "agent-os" and r.get("durability", modes[0]) == m] for m in modes}
    text = (f"# Step benchmark\n\nDurability `{args.durability}`; {args.workers} worker processes; "
            f"{args.warmup:g} s warm-up and {args.duration:g} s measured per run; median of {args.runs} runs "
            "(each run's figure is in rows.jsonl). Everything — server, workers, load (a bus client in the "
            "benchmark process) — on this machine's cores; the Dex figures were measured with the load on another "
            "machine. p50/p99 are per operation: a whole flow for the step scenarios (10 steps), the publish-to-"
            "woken-step time for channel_wake; a step's own latency is as its flow saw it (call to result). "
            "Steps/s of the step scenarios count each flow by the share of its span inside the window.\n")
    if len(modes) > 1:
        text += ("\nEach durability ran on its own process tree; the trees stood side by side, and every run of a "
                 "point went through them in turn, in reverse order every other time.\n")
    idle = next((r for r in rows if r["system"] == "idle"), None)
    for mode, ours in by_mode.items():
        text += f"\n## Durability `{mode}`\n\n" + _table(ours, peers, reference, targets) + "\n"
        if mode == "s3" and idle:
            text += (f"\nThe idle node ({idle['idle_secs']:g} s with no load, before the runs): "
                     f"{idle['puts_per_sec']} PUTs/s (target ≤ 0.3); every request per second, by operation "
                     "and purpose: " + (", ".join(f"{k} {v}" for k, v in idle["requests_per_sec"].items()) or "none")
                     + ".\n")
    if "dbos" in peers:
        text += ("\nDBOS ran as what it is, a library: each run one process that started DBOS on a private "
                 "PostgreSQL (`synchronous_commit=on`) and ran the same closed loop of clients in its own event loop "
                 "(bench/dbos_app.py says what each scenario does there; it offers no ASYNC steps, no locked update "
                 "and no 10 × 16 KiB read). Its process's and PostgreSQL's CPU are in rows.jsonl.\n")
    if "local" in by_mode and "s3" in by_mode:
        text += "\n## s3 against local, same run\n\n" + _s3_vs_local(by_mode["local"], by_mode["s3"]) + "\n"
    if cpu:
        text += "\n".join(cpu_speed.section(cpu)) + "\n"
    results.write_summary(text)
    plt = pyplot()
    ours = [r for r in by_mode["local" if "local" in by_mode else modes[0]] if not r.get("half_peak_of")]
    several = len({(r["scenario"], r["clients"]) for r in ours}) > len({r["scenario"] for r in ours})
    names = [r["scenario"] + (f"\nc={r['clients']}" if several else "") for r in ours]
    fig, ax = plt.subplots(figsize=(11, 5))
    xs = range(len(names))
    width = 0.8 / (2 + len(peers))
    ax.bar([x - width for x in xs], [r["ops_per_sec"] for r in ours], width, label="Agent OS (this machine)")
    ax.bar(list(xs), [reference.get(r["scenario"], 0) for r in ours], width, label="Dex c7gd.large (reference)")
    for i, (name, points) in enumerate(peers.items(), start=1):
        ax.bar([x + i * width for x in xs], [points.get((r["scenario"], r["clients"]), {}).get("ops_per_sec", 0)
                                             for r in ours], width, label=f"{PEER_LABELS[name]} (same machine)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("operations (or steps) per second")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(results.figure_path("steps.png"), dpi=110)
    plt.close(fig)


def _step_latency(row: dict) -> str | None:
    """One step as its flow saw it (call to result), for the step scenarios."""
    if row.get("step_p50_ms") is None:
        return None
    return f"{row['step_p50_ms']:.3f} / {row['step_p99_ms']:.3f}"


def _table(ours: list[dict], peers: dict[str, dict], reference: dict, targets: dict) -> str:
    ours = sorted(ours, key=lambda r: bool(r.get("half_peak_of")))

    def peer_cells(r: dict) -> list:
        return [None if r.get("half_peak_of") else points.get((r["scenario"], r["clients"]), {}).get("ops_per_sec")
                for points in peers.values()]

    table = markdown_table(
        ["scenario", "clients", "Agent OS", "unit", "p50 ms", "p99 ms", "step p50 / p99 ms", "server CPU %",
         "worker CPU %", "S3 CPU %", "fsyncs/s", "PUTs/s", "per PUT", "target", "Dex c7gd.large",
         *(f"{PEER_LABELS[name]} (same run)" for name in peers)],
        [[r["scenario"] + (" (half peak)" if r.get("half_peak_of") else ""), r["clients"], r["ops_per_sec"], r["unit"],
          r["p50_ms"], r["p99_ms"], _step_latency(r), r["server_cpu_percent"],
          r["worker_cpu_percent"], r.get("s3_cpu_percent"), r["fsyncs_per_sec"], r.get("puts_per_sec"), r.get("per_put"),
          None if r.get("half_peak_of") else targets.get(r["scenario"]), reference.get(r["scenario"]), *peer_cells(r)]
         for r in ours])
    for r in ours:
        if r.get("half_peak_of"):
            table += (f"\n\nASYNC steps at half the peak load: c={r['clients']} ran {r['ops_per_sec']:,.0f} steps/s, "
                      f"{100 * r['ops_per_sec'] / r['half_peak_of']:.0f}% of the peak's {r['half_peak_of']:,.0f}; "
                      f"one step took {_step_latency(r)} ms (p50 / p99; target: p50 ≤ 1.3 ms).\n")
    return table


def _s3_vs_local(local: list[dict], s3: list[dict]) -> str:
    """Targets of the object-storage tier: SYNC steps/s in s3 mode ≥ 80% of local at the same
    client count, ≥ 20 SYNC steps per PUT at peak. With several client counts, also each mode's
    peak against the other's."""
    local = [r for r in local if not r.get("half_peak_of")]
    s3 = [r for r in s3 if not r.get("half_peak_of")]
    base = {(r["scenario"], r["clients"]): r for r in local}
    lines = []
    for r in s3:
        other = base.get((r["scenario"], r["clients"]))
        if other and other["ops_per_sec"]:
            lines.append([r["scenario"], r["clients"], other["ops_per_sec"], r["ops_per_sec"],
                          f"{100 * r['ops_per_sec'] / other['ops_per_sec']:.0f}%", r.get("per_put"),
                          r.get("s3_cpu_percent")])
    text = markdown_table(["scenario", "clients", "local", "s3", "s3 / local", "per PUT", "S3 server CPU %"], lines)
    for scenario in dict.fromkeys(r["scenario"] for r in s3):
        mine = [r for r in s3 if r["scenario"] == scenario]
        theirs = [r for r in local if r["scenario"] == scenario]
        if len(mine) > 1 and theirs:
            top = max(mine, key=lambda r: r["ops_per_sec"])
            best = max(theirs, key=lambda r: r["ops_per_sec"])
            if best["ops_per_sec"]:
                text += (f"\n\n{scenario}, peak against peak: s3 {top['ops_per_sec']:,.1f} at c={top['clients']} "
                         f"({top.get('per_put')} per PUT), local {best['ops_per_sec']:,.1f} at c={best['clients']}: "
                         f"{100 * top['ops_per_sec'] / best['ops_per_sec']:.0f}%.")
    return text
