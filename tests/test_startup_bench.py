"""The startup benchmark's summary: medians per mode and their ratio (rows made up, no server)."""
from bench.startup import METRICS, summarize


def test_summary_gives_medians_per_mode_and_their_ratio():
    rows = [{"fork_server": mode, **{m: value for m in METRICS}}
            for mode, value in ((True, 1.0), (True, 2.0), (True, 9.0), (False, 4.0), (False, 4.0), (False, 1.0))]
    table, medians = summarize(rows)
    assert medians[True]["start_secs"] == 2.0 and medians[False]["tree_cpu_secs"] == 4.0
    assert "| start_secs | 2.00 | 4.00 | 0.50 |" in table


def test_a_mode_that_measured_zero_gets_no_ratio():
    rows = [{"fork_server": mode, **{m: 1.0 for m in METRICS}, "idle_cpu_pct": idle}
            for mode, idle in ((True, 0.5), (False, 0.0))]
    table, _ = summarize(rows)
    assert "| idle_cpu_pct | 0.50 | 0.00 | – |" in table
