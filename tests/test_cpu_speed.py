"""bench/cpu_speed.py: how fast the machine ran a fixed Python workload, as a results folder says."""
import pytest

from bench import cpu_speed
from bench.checkpoint_report import summary_markdown


def test_the_workload_is_timed_per_iteration_and_bad_counts_are_refused():
    took = cpu_speed.python_workload(iterations=50, trials=3)
    assert took["iterations"] == 50 and took["trials"] == 3
    assert 0 < took["min_us"] <= took["p50_us"]
    with pytest.raises(ValueError):
        cpu_speed.python_workload(iterations=0)


def test_the_summary_reports_the_cpu_speed_only_when_it_was_measured():
    cpu = {"iterations": 2000, "trials": 5, "p50_us": 25.83, "min_us": 24.55}
    with_it = summary_markdown([], {"bench": {"workers": 10}, "python_workload": cpu})
    assert "## CPU speed" in with_it and "25.8 µs per iteration (fastest trial 24.6)" in with_it
    assert "## CPU speed" not in summary_markdown([], {"bench": {"workers": 10}})
