"""The chaos bench's accounting (its row) and report (summary.md and chaos.png; bench/chaos.py)."""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from bench.results import ResultsDir, markdown_table, pyplot

if TYPE_CHECKING:
    from bench.chaos_clients import Ledger


def accounting(args, ledger: "Ledger", kills: list[dict], checked: dict, lost_checkpoints: list,
               restarts: dict[str, int], phases: dict, after: dict) -> dict[str, Any]:
    """The run's row: what was lost, hung, acknowledged and refused, kills and restarts, memory."""
    lost = len(checked["lost"]["turns"]) + len(checked["lost"]["flows"]) + len(lost_checkpoints) \
        + len(checked["lost"]["closes"]) + len(checked["lost"].get("session_forks", ()))
    before = phases["before"]
    return {
        "duration_secs": args.duration, "deadline_secs": args.deadline, "kills": len(kills),
        "kills_by_role": dict(collections.Counter(k["role"] for k in kills)),
        "restarts_by_role": restarts,
        "lost": lost, "lost_turns": checked["lost"]["turns"][:20], "lost_flows": checked["lost"]["flows"][:20],
        "lost_checkpoints": lost_checkpoints[:20], "closes_undone": checked["lost"]["closes"][:20],
        "lost_session_forks": checked["lost"].get("session_forks", [])[:20],
        "hung": ledger.turns["hung"], "hung_streams": ledger.hung[:20],
        "turn_outcomes": dict(ledger.turns), "turn_failures": dict(ledger.turn_failures), "turns_resumed": ledger.resumed, "streams_with_gaps": ledger.reordered,
        "acknowledged": {"turns": len(ledger.completed), "checkpoints": sum(map(len, ledger.checkpoints.values())),
                         "flows": len(ledger.flows), "closes": len(ledger.closed),
                         "run_forks": ledger.forks["runs"], "session_forks": ledger.forks["sessions"],
                         "scheduled_runs": ledger.forks["scheduled"], "queued_runs": ledger.forks["queued"],
                         "fanned_runs": ledger.forks["fanned"], "chosen_runs": ledger.forks["chosen"],
                         "messenger_runs": ledger.forks["messengers"], "ticketed_runs": ledger.forks["ticketed"]},
        "checkpoint_errors": {str(k): v for k, v in ledger.checkpoint_errors.items()},
        "flow_errors": {str(k): v for k, v in ledger.flow_errors.items()},
        "close_errors": {str(k): v for k, v in ledger.close_errors.items()},
        "fork_errors": dict(ledger.fork_errors),
        "flow_results": checked["flow_results"],
        "memory_kib": {name: {"before_private": before.get(name, {}).get("private_kib"),
                              "after_private": m["private_kib"], "before_rss": before.get(name, {}).get("rss_kib"),
                              "after_rss": m["rss_kib"], "pid": m["pid"],
                              "restarted": before.get(name, {}).get("pid") != m["pid"]}
                       for name, m in after.items()},
    }


def write_report(results: ResultsDir, row: dict, kills: list[dict], ledger: "Ledger", phases: dict) -> None:
    acked = row["acknowledged"]
    lines = [
        f"# Chaos: {row['duration_secs']:.0f} s of SIGKILLs ({row['kills']} kills)", "",
        f"**lost = {row['lost']}**, **hung = {row['hung']}** "
        f"(acknowledged: {acked['turns']} completed turns, {acked['checkpoints']} checkpoints, "
        f"{acked['flows']} flow runs of which {acked.get('run_forks', 0)} forks and "
        f"{acked.get('scheduled_runs', 0)} a schedule's and {acked.get('queued_runs', 0)} a flow queue's, "
        f"{acked.get('fanned_runs', 0)} ran their steps and two children at once, "
        f"{acked.get('chosen_runs', 0)} waited for a message on either of two channels "
        f"({acked.get('messenger_runs', 0)} of them sent by another run, {acked.get('ticketed_runs', 0)} published "
        "to the tenant's channel for the run whose attribute named it), "
        f"{acked['closes']} closed "
        f"sessions, {acked.get('session_forks', 0)} forked sessions)", "",
        "Lost counts a completed turn whose assistant message is missing from the transcript or differs from "
        "what was streamed, an acknowledged checkpoint missing from the log, an accepted flow run that did not "
        "complete with its result (a chosen run also: with its one emitted value, once) (forks of runs too, runs that waited in a flow queue, and each second of a schedule made before the kills "
        "and deleted after them), a closed session that a read still finds, a forked session that does not hold the messages it was answered with. Hung counts streams with neither a terminal event nor a clean close within "
        "the deadline.", "",
        _jsonl_line(row.get("jsonl")), "",
        "ERROR or CRITICAL records in the tree's logs (kept in this folder): "
        + ", ".join(f"{name} {count}" for name, count in row["logged_errors"].items()) + ".", "",
        *(["```\n" + "\n".join(row["logged_error_lines"]) + "\n```", ""] if row["logged_error_lines"] else []),
        "## Turn outcomes", "",
        markdown_table(["outcome", "turns"], sorted(row["turn_outcomes"].items())), "",
        f"Failed turns by their error code: {row.get('turn_failures', {})} (`bad_request`: the provider refused "
        "the history, as it does one with a tool call left unanswered).", "",
        f"Streams picked up again with Last-Event-ID after a drop: {row['turns_resumed']}; "
        f"streams whose event ids had a gap or repeat: {row['streams_with_gaps']}.", "",
        *([f"Hung streams (posted at: seconds on the kills' clock; a stream's deadline {row['deadline_secs']:g} s): "
           + "; ".join(f"{h['session']} turn {h['turn_id']} posted at {h['posted_at']} s, last event id "
                       f"{h['last_event_id']}, picked up again {h['resumes']} times" for h in row["hung_streams"]), ""]
          if row.get("hung_streams") else []),
        f"Flow runs: {row['flow_results']}; start errors seen by clients (retried with the same key): "
        f"{row['flow_errors']}. Checkpoint PUT errors: {row['checkpoint_errors']}. Close errors (retried): "
        f"{row['close_errors']}; closed sessions found again: {row['closes_undone']}. Fork errors (a run's "
        f"retried with the same key, a session's not): {row.get('fork_errors', {})}; forked sessions without "
        f"their messages: {row.get('lost_session_forks', [])}.", "",
        *_outage_lines(row.get("bucket_outages")), *_stall_lines(row.get("stalls")),
        "## Kills and restarts per role", "",
        markdown_table(["role", "kills", "restarts"],
                       [(name, row["kills_by_role"].get(name, 0), n) for name, n in sorted(row["restarts_by_role"].items())]),
        "", "## Memory per process (private KiB)", "",
        "Before: after warm-up, under load, before the first kill. After: the settled tree after the run "
        "(a process that was restarted is a new incarnation).", "",
        markdown_table(["process", "before", "after", "restarted"],
                       [(name, m["before_private"], m["after_private"], "yes" if m["restarted"] else "")
                        for name, m in sorted(row["memory_kib"].items())]),
    ]
    results.write_summary("\n".join(lines))
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [3, 2]})
    span = range(0, int(max(ledger.timeline or [0])) + 1)
    for what in ("turns", "checkpoints", "flows"):
        top.plot(list(span), [ledger.timeline.get(t, {}).get(what, 0) for t in span], label=f"{what} acknowledged/s")
    for k in kills:
        top.axvline(k["t"], color="red", alpha=0.25, linewidth=0.8)
    for o in row.get("bucket_outages") or ():
        top.axvspan(o["t"], o["t"] + o["secs"], color="purple", alpha=0.12)
    for o in row.get("stalls") or ():
        top.axvspan(o["t"], o["t"] + o["secs"], color="orange", alpha=0.12)
    top.axvspan(phases["chaos_from"], phases["chaos_to"], color="red", alpha=0.04, label="kills (red lines)")
    top.set_xlabel("seconds")
    top.legend(loc="upper right", fontsize=8)
    top.set_title(f"Acknowledged work per second under SIGKILL; lost={row['lost']} hung={row['hung']}")
    names = sorted(row["memory_kib"])
    xs = range(len(names))
    bottom.bar([x - 0.2 for x in xs], [(row["memory_kib"][n]["before_private"] or 0) / 1024 for n in names], 0.4,
               label="after warm-up")
    bottom.bar([x + 0.2 for x in xs], [row["memory_kib"][n]["after_private"] / 1024 for n in names], 0.4,
               label="after the run")
    bottom.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    bottom.set_ylabel("private MiB")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(results.figure_path("chaos.png"), dpi=110)
    plt.close(fig)


def _outage_lines(outages: list[dict] | None) -> list[str]:
    if not outages:
        return []
    return [f"The bucket went away {len(outages)} times ({sum(o['secs'] for o in outages):.1f} s in all; "
            + ", ".join(f"{o['t']:.0f} s {o['mode']} for {o['secs']:.1f} s" for o in outages)
            + "; purple in the plot).", ""]


def _stall_lines(stalls: list[dict] | None) -> list[str]:
    if not stalls:
        return []
    return [f"Roles stopped with SIGSTOP and continued {len(stalls)} times "
            f"({sum(s['secs'] for s in stalls):.1f} s in all; orange in the plot): "
            + ", ".join(f"{s['role']} for {s['secs']:.1f} s at {s['t']:.0f} s" for s in stalls) + ".", ""]


def _jsonl_line(jsonl: dict | None) -> str:
    if jsonl is None:
        return "The JSON-lines copy of the events was not checked."
    line = (f"The JSON-lines copy of the events (`storage.jsonl_dir`): {jsonl['lines']} lines for the "
            f"{jsonl['log_events']} event records the logs hold; **missing {jsonl['missing']}, extra "
            f"{jsonl['extra']}**, unreadable lines {jsonl['bad_lines']}.")
    for label, first in (("missing", jsonl["missing_first"]), ("extra", jsonl["extra_first"])):
        if first:
            line += f" First {label}: " + "; ".join("/".join(map(str, k)) for k in first[:3]) + "."
    return line
