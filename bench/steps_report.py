"""The report of a step benchmark: summary.md with the table, and a PNG bar chart."""
from __future__ import annotations

from typing import Any

from bench.results import ResultsDir, markdown_table, pyplot


def write_report(results: ResultsDir, rows: list[dict], args: Any, reference: dict, targets: dict) -> None:
    ours = [r for r in rows if r["system"] == "agent-os"]
    peer = {r["scenario"]: r for r in rows if r["system"] == "restate"}
    table = markdown_table(
        ["scenario", "clients", "Agent OS", "unit", "p50 ms", "p99 ms", "server CPU %", "worker CPU %", "fsyncs/s",
         "PUTs/s", "per PUT", "target", "Dex c7gd.large", "Restate (same run)"],
        [[r["scenario"], r["clients"], r["ops_per_sec"], r["unit"], r["p50_ms"], r["p99_ms"], r["server_cpu_percent"],
          r["worker_cpu_percent"], r["fsyncs_per_sec"], r.get("puts_per_sec"), r.get("per_put"),
          targets.get(r["scenario"]), reference.get(r["scenario"]),
          peer[r["scenario"]]["ops_per_sec"] if r["scenario"] in peer else None] for r in ours])
    text = (f"# Step benchmark\n\nDurability `{args.durability}`; {args.workers} worker processes; "
            f"{args.warmup:g} s warm-up and {args.duration:g} s measured per run; median of {args.runs} runs "
            "(each run's figure is in rows.jsonl). Everything — server, workers, load (a bus client in the "
            "benchmark process) — on this machine's cores; the Dex figures were measured with the load on another "
            "machine. p50/p99 are per operation: a whole flow for the step scenarios (10 steps), the publish-to-"
            "woken-step time for channel_wake.\n\n" + table + "\n")
    results.write_summary(text)
    plt = pyplot()
    names = [r["scenario"] for r in ours]
    fig, ax = plt.subplots(figsize=(11, 5))
    xs = range(len(names))
    width = 0.27
    ax.bar([x - width for x in xs], [r["ops_per_sec"] for r in ours], width, label="Agent OS (this machine)")
    ax.bar(list(xs), [reference.get(n, 0) for n in names], width, label="Dex c7gd.large (reference)")
    if peer:
        ax.bar([x + width for x in xs], [peer[n]["ops_per_sec"] if n in peer else 0 for n in names], width,
               label="Restate (same machine)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("operations (or steps) per second")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(results.figure_path("steps.png"), dpi=110)
    plt.close(fig)
