"""The benchmarks' own arithmetic (unit tests, no server): how the step benchmark's closed loop
counts work in its window, how its summary sets s3 against local over a sweep of client counts,
and how the turn benchmark's summary prices full persistence over alternating rounds, for
profile variants too, beside each round's log batches, CPU and disk."""
from __future__ import annotations

import asyncio
import json
import types

import pytest

from bench.results import ResultsDir
from bench.steps_measure import closed_loop
from bench.steps_report import write_report
from bench.turns_report import write_report as write_turns_report


def test_closed_loop_counts_each_operation_by_its_share_of_the_window():
    async def op(index: int, n: int) -> None:
        await asyncio.sleep(0.02 + 0.01 * index)   # clients out of step, so edges cut operations

    # a 1.5 s window (was 0.4): a stall of a loaded machine over all of it ended no operation in it
    ended, latencies, errors, window, work = asyncio.run(closed_loop(op, 4, 0.05, 1.5))
    assert errors == 0 and window == 1.5 and len(latencies) == ended > 0
    # An operation contributes its share inside the window: one that straddles either edge counts
    # for less than one (begun in the warm-up) or more than none (ended after the window).
    assert ended - 4 < work < ended + 4
    assert work != ended   # the edges were cut, so some operation counted for part


def _row(durability: str, clients: int, steps: float, per_put: float | None = None) -> dict:
    return {"system": "agent-os", "scenario": "sync_steps", "clients": clients, "durability": durability,
            "unit": "steps/s", "ops_per_sec": steps, "p50_ms": 1.0, "p99_ms": 2.0, "step_p50_ms": 0.1,
            "step_p99_ms": 0.2, "server_cpu_percent": 100.0, "worker_cpu_percent": 50.0, "fsyncs_per_sec": 60.0,
            "puts_per_sec": 40.0 if per_put else None, "per_put": per_put, "s3_cpu_percent": 20.0 if per_put else None}


def test_summary_sets_s3_against_local_at_each_client_count_and_peak_against_peak(tmp_path):
    results = ResultsDir("sweep", tmp_path)
    rows = [_row("local", 512, 3000.0), _row("local", 1024, 2800.0),
            _row("s3", 512, 1800.0, 45.0), _row("s3", 1024, 2520.0, 60.0),
            {"system": "idle", "durability": "s3", "idle_secs": 20.0, "puts_per_sec": 0.25,
             "requests_per_sec": {'op="put",purpose="lease"': 0.25}}]
    args = types.SimpleNamespace(durability="local,s3", workers=2, warmup=3.0, duration=10.0, runs=1)
    write_report(results, rows, args, {"sync_steps": 1772}, {"sync_steps": 2700})
    text = (results.path / "summary.md").read_text()
    assert "| sync_steps | 512 | 3,000.0 | 1,800.0 | 60% | 45.0 |" in text
    assert "| sync_steps | 1024 | 2,800.0 | 2,520.0 | 90% | 60.0 |" in text
    assert "peak against peak: s3 2,520.0 at c=1024 (60.0 per PUT), local 3,000.0 at c=512: 84%." in text
    assert "The idle node (20 s with no load, before the runs): 0.25 PUTs/s (target ≤ 0.3)" in text
    assert 'op="put",purpose="lease" 0.25.' in text
    assert (results.path / "steps.png").stat().st_size > 0


def test_each_peer_of_the_step_benchmark_gets_a_column_and_only_where_it_ran(tmp_path):
    results = ResultsDir("peers", tmp_path)
    ours = [_row("local", 128, 4600.0), {**_row("local", 64, 7700.0), "scenario": "async_steps"}]
    rows = [*ours, {"system": "restate", "scenario": "sync_steps", "clients": 128, "ops_per_sec": 900.0},
            {"system": "restate", "scenario": "async_steps", "clients": 64, "ops_per_sec": 1100.0},
            {"system": "dbos", "scenario": "sync_steps", "clients": 128, "ops_per_sec": 210.0}]
    args = types.SimpleNamespace(durability="local", workers=2, warmup=3.0, duration=10.0, runs=1)
    write_report(results, rows, args, {"sync_steps": 1772}, {"sync_steps": 2700},
                 {"iterations": 2000, "trials": 5, "p50_us": 17.97, "min_us": 14.75})
    text = (results.path / "summary.md").read_text()
    assert "## CPU speed" in text and "18.0 µs per iteration (fastest trial 14.8)" in text
    assert "| Restate (same run) | DBOS (same run) |" in text
    assert "| 2700 | 1772 | 900.0 | 210.0 |" in text          # sync_steps: both peers
    assert "| – | – | 1,100.0 | – |" in text                # async_steps: Restate ran it, DBOS offers none
    assert "DBOS ran as what it is, a library" in text
    assert (results.path / "steps.png").stat().st_size > 0



def test_the_step_benchmark_refuses_an_unknown_peer():
    from bench.steps import parse_args

    assert parse_args(["--peer", "restate,dbos"]).peer == "restate,dbos"
    with pytest.raises(SystemExit):
        parse_args(["--peer", "temporal"])


def _turn_row(profile: str, rnd: int, c: int, turns_per_sec: float, failed: int = 0) -> dict:
    return {"profile": profile, "round": rnd, "concurrency": c, "turns_per_sec": turns_per_sec,
            "ttft_ms": {"p50": 2000.0, "p99": 2100.0}, "turn_ms": {"p50": 2040.0, "p95": 2080.0, "p99": 2100.0},
            "counts": {"ok": 100, "failed": failed, "rejected_429": 0}, "server_private_dirty_kib": 2048}


def test_turn_summary_prices_persistence_over_alternating_rounds(tmp_path):
    results = ResultsDir("turns", tmp_path)
    slow = ("2026-12-02 14:01:02,003 agent-os.writer/log/0 WARNING log /tmp/wal/0: a batch of 40 records took "
            "1210 ms: rotating 0, writing 3, fdatasync 1207")
    rows = [_turn_row("core", 1, 1000, 340.0), _turn_row("persist", 1, 1000, 320.0),
            {**_turn_row("persist", 2, 1000, 330.0), "server_log": [slow]}, _turn_row("core", 2, 1000, 310.0, failed=2)]
    args = types.SimpleNamespace(mock_ttft_ms=2000.0, mock_tps=200.0, mock_tokens=8, warmup=3.0, duration=15.0)
    write_turns_report(results, rows, args)
    text = (results.path / "summary.md").read_text()
    # means 325.0 and 325.0: no cost, though each round alone said +6% and -6%
    assert "| 1000 | 340.0 / 310.0 | 320.0 / 330.0 | 325.0 | 325.0 | 0.0% | 2 / 0 |" in text
    assert "| round | c | turns/s" in text and "| 2 | 1000 | 310.0 |" in text
    # what the tree warned of during a round is quoted under that round, and only that round
    assert "## What our server warned of during the rounds" in text
    assert "Agent OS, full persistence (local), c=1000, round 2:\n\n```\n" + slow + "\n```" in text
    assert text.count("```\n") == 2


def test_failover_report_splits_lease_wait_and_rebuild(tmp_path):
    from bench.failover import parse_args, takeover_time, write_report as write_failover_report
    log = ("2026-11-30 18:00:01,250 agentos.lease INFO standby: node b watches\n"
           "2026-11-30 18:00:09,750 agentos.lease WARNING took over the cluster lease from a (epoch 1 -> 2)\n")
    assert takeover_time(log) - takeover_time(log.splitlines()[1].replace("09,750", "01,250")) == 8.5
    assert takeover_time("no such line\n") is None
    results = ResultsDir("failover", tmp_path)
    rows = [{"run": 1, "load_secs": 6.5, "acked": 900, "failover_secs": 14.0, "lease_wait_secs": 12.5, "rebuild_secs": 1.5,
             "acked_missing": 0, "acked_twice": 0, "sessions_older_than_acked": 0},
            {"run": 2, "load_secs": 7.25, "acked": 950, "failover_secs": 13.0, "lease_wait_secs": 11.0, "rebuild_secs": 2.0,
             "acked_missing": 0, "acked_twice": 0, "sessions_older_than_acked": 0}]
    write_failover_report(results, rows, parse_args(["--runs", "2"]))
    text = (results.path / "summary.md").read_text()
    assert "| 2 | 7.25 | 950 | 13.0 | 11.0 | 2.00 | 0 | 0 | 0 |" in text
    assert "Median failover 13.50 s (min 13.00, max 14.00)" in text


def test_metric_samples_by_exact_name_and_by_family(monkeypatch):
    import bench.steps_measure as measure
    monkeypatch.setattr(measure, "_metric_lines", lambda url: [
        "# HELP agentos_log_fsyncs_total x", "agentos_log_fsyncs_total 12.0",
        'agentos_s3_requests_total{op="put",purpose="lease"} 3.0',
        'agentos_s3_requests_total{op="put",purpose="wal"} 7.0'])
    assert measure.scrape("u", "agentos_log_fsyncs_total") == 12.0
    assert measure.scrape("u", measure.PUTS) == 7.0 and measure.scrape("u", "absent") == 0.0
    assert measure.scrape_family("u", "agentos_s3_requests_total") == {
        'op="put",purpose="lease"': 3.0, 'op="put",purpose="wal"': 7.0}


def test_an_acked_checkpoint_a_newer_one_superseded_is_not_counted_lost():
    """Compaction drops a session's older checkpoints: the chaos and failover checks accept that,
    and still count one that is gone with nothing newer in its place."""
    import collections

    from bench.logged_checkpoints import lost_from_log
    from bench.failover import newest_kept

    acked = {"s1": [0, 1, 2], "s2": [0, 1], "s3": [5]}
    in_log = {"s1": {"v2"}, "s2": {"v0"}}
    assert lost_from_log(acked, in_log) == [("s2", 1), ("s3", 5)]
    rows = collections.Counter({("s1", "k2"): 1, ("s2", "k0"): 1, ("s2", "notes"): 1})
    assert newest_kept(rows) == {"s1": 2, "s2": 0}


def test_the_chaos_check_of_the_jsonl_copy_counts_missing_and_extra_lines(tmp_path):
    """Against the logs' records: each once; a closable session only at most once (its records
    may have left the log, or come after its close and never been loaded)."""
    import collections

    from bench.chaos_closes import closable
    from bench.chaos_jsonl import compare, events_in_file

    (tmp_path / "events.jsonl").write_bytes(
        b'{"session":"a","turn":"t1","seq":1,"type":"turn.started"}\n'
        b'{"session":"a","turn":"t1","seq":2,"type":"turn.completed"}\n'
        b'{"session":"a","turn":"t1","seq":2,"type":"turn.completed"}\n'     # twice
        b'{"session":"chaos-x0-1","turn":"t2","seq":1,"type":"turn.started"}\n'   # closed: left the log
        b'{"session":"chaos-x0-2","turn":"t3","seq":1,"type":"turn.started"}\n'
        b'{"session":"chaos-x0-2","turn":"t3","seq":1,"type":"turn.started"}\n'   # twice, closed or not
        b'{"session":"a","tu')                                                   # torn
    in_file, bad = events_in_file(tmp_path)
    key = lambda s, t, n, ty: (s, t, n, ty)   # noqa: E731
    in_log = collections.Counter({key("a", "t1", 1, "turn.started"): 1, key("a", "t1", 2, "turn.completed"): 1,
                                  key("a", "t9", 1, "turn.started"): 1,               # no line
                                  key("chaos-x0-3", "t4", 1, "turn.started"): 1})     # after its close
    report = compare(in_log, in_file, bad, closable)
    assert (report["lines"], report["log_events"], report["bad_lines"]) == (6, 4, 1)
    assert report["missing_first"] == [["a", "t9", 1, "turn.started"]]
    assert sorted(report["extra_first"]) == [["a", "t1", 2, "turn.completed"], ["chaos-x0-2", "t3", 1, "turn.started"]]
    assert (report["missing"], report["extra"]) == (1, 2)


def test_a_profile_variant_runs_with_its_own_keys_and_is_priced_beside_persist(tmp_path):
    from bench.turns import bench_config
    variant = "persist:storage.commit_window_us=0;kernel.actors=1"
    config = bench_config(variant, "http://127.0.0.1:1", 1000, 2)
    assert config["storage"] == {"durability": "local", "commit_window_us": 0}
    assert config["kernel"]["actors"] == 1 and config["kernel"]["session_ttl_secs"] == 3600
    for bad in ("durable", "persist:storage.commit_window_us"):
        try:
            bench_config(bad, "", 0, 0)
        except ValueError as exc:
            assert repr(bad) in str(exc)
        else:
            raise AssertionError(f"{bad!r} was taken")

    def measured(row: dict, batches_over_20ms: int) -> dict:
        return {**row, "log_fsync": {"batches": 900, "mean_ms": 2.5, "p50_le_ms": 1.0, "p99_le_ms": 50.0,
                                     "max_le_ms": 200.0, "over_20ms": batches_over_20ms, "over_100ms": 1,
                                     "zeroed": {"idle": 2, "ahead": 1}, "compacted": 0},
                "server_cpu_by_process": {"gateway/0": 25.0, "writer/log/0": 9.5}, "machine_busy_percent": 140.0,
                "server_cpu_percent": 100.0, "server_written_mb_by_process": {"writer/log/0": 40.0},
                "disk": {"device": "vda", "writes": 6000, "write_mb": 55.0, "write_ms": 1000, "flushes": 2000,
                         "flush_ms": 200, "discards": 12, "discard_mb": 64.0, "discard_ms": 30}}
    rows = [_turn_row("core", 1, 1000, 480.0), measured(_turn_row("persist", 1, 1000, 456.0), 38),
            measured(_turn_row(variant, 1, 1000, 470.4), 24)]
    args = types.SimpleNamespace(mock_ttft_ms=2000.0, mock_tps=200.0, mock_tokens=8, warmup=3.0, duration=15.0)
    results = ResultsDir("variants", tmp_path)
    write_turns_report(results, rows, args)
    text = (results.path / "summary.md").read_text()
    assert "## Agent OS, full persistence (local), storage.commit_window_us=0;kernel.actors=1" in text
    assert "| persist | 1000 | 480.0 | 456.0 | 480.0 | 456.0 | 5.0% | 0 / 0 |" in text
    assert f"| {variant} | 1000 | 480.0 | 470.4 | 480.0 | 470.4 | 2.0% | 0 / 0 |" in text
    assert "| persist | 1000 | 1 | 456.0 | 2,080.0 | 900 | 2.50 | ≤ 1 | ≤ 50 | ≤ 200 | 38 | 1 | ahead 1, idle 2 | 0 |" in text
    assert "| persist | 1000 | 1 | 456.0 | 140.0 | 100.0 | 25.0 | 9.50 |" in text
    assert "| persist | 1000 | 1 | 456.0 | 55.0 | 6000 | 1000 | 2000 | 200 | 64.0 | 30 | 40.0 |" in text


def test_disk_counters_read_the_device_under_a_path(tmp_path):
    import os
    from bench.sampling import disk_counters
    dev = os.stat(tmp_path).st_dev
    fake = tmp_path / "diskstats"
    # major minor name, reads (4), writes: done merged sectors ms, in flight, io ms, weighted ms,
    # discards: done merged sectors ms, flushes: done ms
    fake.write_text(f"   1 99 other 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n"
                    f"{os.major(dev):4d} {os.minor(dev)} vdz 1 2 3 4 50 6 20000 900 0 10 11 3 0 131072 40 70 12\n")
    assert disk_counters(str(tmp_path), str(fake)) == {
        "device": "vdz", "writes": 50, "write_mb": 20000 * 512 / 1e6, "write_ms": 900, "discards": 3,
        "discard_mb": 131072 * 512 / 1e6, "discard_ms": 40, "flushes": 70, "flush_ms": 12}
    fake.write_text(f"{os.major(dev):4d} {os.minor(dev)} vdz 1 2 3 4 50 6 20000 900 0 10 11\n")   # no flush fields
    assert disk_counters(str(tmp_path), str(fake)) is None


def test_tree_ab_report_gives_each_scenario_its_ratio_and_rounds_ahead(tmp_path):
    from bench import tree_ab_report

    rows = [{"arm": arm, "round": k, "scenario": "attr_read_10x16k", "ops_per_sec": ops, "p50_ms": p50}
            for arm, k, ops, p50 in [("before", 1, 3000.0, 10.0), ("after", 1, 6000.0, 5.0),
                                     ("after", 2, 6500.0, 4.0), ("before", 2, 3500.0, 9.0),
                                     ("before", 3, 2000.0, 12.0), ("after", 3, 1900.0, 13.0)]]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tree_ab_report.main([str(tmp_path), "A title", "--before", "ring off", "--after", "ring on"]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# A title\n\n## Conditions\n")
    assert "| attr_read_10x16k | 3,000 / 3,500 / 2,000 | 6,000 / 6,500 / 1,900 | 2.00× | 10.00 → 5.00 | 2 of 3 |" in text
    assert "ring on / ring off (medians)" in text and (tmp_path / "rounds.png").stat().st_size > 0


def test_bus_bodies_runs_both_arms_in_processes_of_their_own_and_leaves_nothing(tmp_path):
    """`python -m bench.bus_bodies`, one short round: a row per arm, the summary's ratio, the plot,
    and no ring left in /dev/shm (its trials kill their broker and replier)."""
    import os

    from bench import bus_bodies
    assert bus_bodies.main(["--sizes", "20k", "--rounds", "1", "--secs", "0.3", "--results-root", str(tmp_path)]) == 0
    folder = next(tmp_path.iterdir())
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["arm"] for r in rows) == ["broker", "ring"]
    assert all(r["size"] == 20 * 1024 and r["replies"] > 0 and set(r["cpu_us_per_reply"]) == set(bus_bodies.PROCESSES)
               for r in rows)
    assert "| 20 KiB |" in (folder / "summary.md").read_text() and (folder / "replies.png").stat().st_size > 0
    assert all(r["ring_dir"] and not os.path.exists(r["ring_dir"]) for r in rows)


def test_the_soak_ends_when_the_server_dies_instead_of_loading_a_dead_port(tmp_path):
    """A soak whose server exits stops its load at the next sample and says so: it does not spend
    the rest of its half hour counting refused connections as turns."""
    from bench import soak

    class Dying:
        url = "http://127.0.0.1:9"   # discard port: nothing listens, every connection is refused

        def __init__(self):
            self.polls = 0
            self.returncode = None
            self.proc = self

        def poll(self):
            self.polls += 1
            if self.polls > 3:
                self.returncode = -9
            return self.returncode

        def pids(self):
            if self.polls == 1:
                raise FileNotFoundError("processes.json")   # the table gone before the process is reaped
            return {}

    args = soak.parse_args(["--minutes", "10", "--warmup-minutes", "0", "--clients", "2", "--sample-secs", "0.05"])
    rows, counts, phases = asyncio.run(asyncio.wait_for(soak.soak(Dying(), args), 30))
    assert phases["exited"] == -9 and "idle" not in phases
    assert phases["load_end"] < 30
    assert len(rows) == 2       # no row for the sample whose process table was gone
