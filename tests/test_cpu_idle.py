"""bench/cpu_idle.py: the wakeup round trip a results folder records, and the idle-latency hold."""
import os
import struct
from pathlib import Path

import pytest

from bench import cpu_idle
from bench.checkpoint_report import summary_markdown


def children() -> list[tuple[int, str]]:
    """(pid, state) of this process's children, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields and int(fields[1]) == os.getpid():
            out.append((int(entry), fields[0]))
    return out


def test_the_wakeup_round_trip_is_measured_and_its_child_reaped():
    took = cpu_idle.wakeup_round_trip(200)
    assert took["n"] == 200 and 0 < took["p50_us"] <= took["p99_us"]
    assert not [pid for pid, state in children() if state == "Z"]   # the echoing child was reaped
    with pytest.raises(ValueError):
        cpu_idle.wakeup_round_trip(0)


def test_the_limit_is_written_held_for_the_block_and_refused_clearly(tmp_path):
    device = tmp_path / "qos"          # stands in for /dev/cpu_dma_latency, which needs root
    device.write_bytes(b"")
    with cpu_idle.idle_latency_limit(5, str(device)) as held:
        assert held == 5 and struct.unpack("i", device.read_bytes()) == (5,)
    with cpu_idle.idle_latency_limit(None, str(device)) as held:
        assert held is None
    with pytest.raises(ValueError):
        with cpu_idle.idle_latency_limit(-1, str(device)):
            pass
    with pytest.raises(RuntimeError, match="cannot hold a CPU idle-latency limit"):
        with cpu_idle.idle_latency_limit(0, str(tmp_path / "missing" / "qos")):
            pass


def test_the_summary_says_how_fast_the_machine_woke_and_whether_the_limit_was_held():
    wakeup = {"n": 5000, "p50_us": 13.8, "p99_us": 21.1, "mean_us": 14.4}
    held = summary_markdown([], {"bench": {"workers": 10}, "wakeup_round_trip": wakeup, "cpu_latency_us": 0})
    assert "round trip p50 13.8 µs, p99 21.1 µs; idle CPUs held to wake within 0 µs" in held
    assert "as the machine left them" in summary_markdown(
        [], {"bench": {"workers": 10}, "wakeup_round_trip": wakeup, "cpu_latency_us": None})
