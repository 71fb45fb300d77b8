"""/metrics sums every process's files; a file another process is creating must not fail it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_a_metrics_file_still_being_created_does_not_fail_the_scrape(tmp_path):
    # Values written by one process, then an empty file as a starting process leaves it for a moment.
    script = textwrap.dedent("""
        from agentos import metrics
        metrics.admission_rejected.inc(3)
        open(sys.argv[1] + "/counter_999999.db", "wb").close()
        print(metrics.render().decode())
    """)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import sys\n" + script, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "agentos_admission_rejected_total 3.0" in out.stdout


def _process_that_counts(path) -> int:
    """A process of the tree: counts, observes, sets a live gauge, exits. Returns its pid."""
    script = textwrap.dedent("""
        import os
        from agentos import metrics
        metrics.admission_rejected.inc(2)
        metrics.turn_duration.observe(5.0)
        metrics.in_flight_turns.set(7)
        print(os.getpid())
    """)
    out = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(path)),
                         capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout)


def _scrape(path) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from agentos.metrics_files import TreeCollector
    registry = CollectorRegistry()
    TreeCollector(registry, path=str(path))
    return generate_latest(registry).decode()


def _metric_files(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".db"))


def test_a_dead_processes_counts_stay_in_the_sums_in_one_file_per_type(tmp_path):
    from agentos.metrics_files import retire
    for _ in range(3):
        retire(_process_that_counts(tmp_path), str(tmp_path))
    # folded at once, not at the next scrape: a server nobody scrapes does not grow the directory
    assert _metric_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]
    text = _scrape(tmp_path)
    assert "agentos_admission_rejected_total 6.0" in text
    assert "agentos_turn_duration_ms_count 3.0" in text
    assert 'agentos_turn_duration_ms_bucket{le="5.0"} 3.0' in text
    assert "agentos_in_flight_turns" not in text            # a live gauge: gone with its process
    assert _metric_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]

    retire(_process_that_counts(tmp_path), str(tmp_path))   # restarts do not add files, only counts
    assert "agentos_admission_rejected_total 8.0" in _scrape(tmp_path)
    assert _metric_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]

    # A dead file that cannot be read (a torn write) is dropped, and the scrape still answers.
    (tmp_path / "counter_dead-4242.db").write_bytes((1 << 20).to_bytes(4, "little") + bytes(60))
    text = _scrape(tmp_path)
    assert "agentos_admission_rejected_total 8.0" in text
    assert _metric_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]


def test_processes_retired_without_a_fold_are_counted_once_and_folded_at_once_after(tmp_path):
    """A tree that stops retires every process, then folds once (agentos/supervisor.py `stop_all`)."""
    from agentos.metrics_files import fold_dead, retire
    retire(_process_that_counts(tmp_path), str(tmp_path))
    pids = [_process_that_counts(tmp_path) for _ in range(2)]
    for pid in pids:
        retire(pid, str(tmp_path), fold_now=False)
    assert _metric_files(tmp_path) == sorted(["counter_archive.db", "histogram_archive.db",
                                              *(f"{t}_dead-{p}.db" for t in ("counter", "histogram") for p in pids)])
    fold_dead(str(tmp_path))
    assert _metric_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]
    text = _scrape(tmp_path)
    assert "agentos_admission_rejected_total 6.0" in text and "agentos_turn_duration_ms_count 3.0" in text
    assert "agentos_in_flight_turns" not in text            # their live gauges went with them


def test_a_live_process_is_read_beside_the_archive(tmp_path):
    from agentos.metrics_files import retire
    retire(_process_that_counts(tmp_path), str(tmp_path))
    pid = _process_that_counts(tmp_path)         # exited, but not reaped yet: its files are as a live one's
    text = _scrape(tmp_path)
    assert "agentos_admission_rejected_total 4.0" in text
    assert f"counter_{pid}.db" in {p.name for p in tmp_path.iterdir()}
    retire(pid, str(tmp_path))
    assert "agentos_admission_rejected_total 4.0" in _scrape(tmp_path)


def test_scrapes_beside_processes_dying_never_count_one_twice_or_lose_it(tmp_path):
    """A scraper in another process, reading as fast as it can while processes die and are folded:
    every total it reads is one the counts went through (never a dead process counted twice, never
    one missing), and the last is the sum of all."""
    from agentos.metrics_files import retire
    (tmp_path / "running").touch()
    scraper = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, re, sys, time
        from prometheus_client import CollectorRegistry, generate_latest
        from agentos.metrics_files import TreeCollector
        registry = CollectorRegistry()
        TreeCollector(registry, path=sys.argv[1])
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            last = not os.path.exists(sys.argv[2])    # one more after the test says stop
            found = re.search(r"agentos_admission_rejected_total ([0-9.]+)", generate_latest(registry).decode())
            print(found.group(1) if found else "0", flush=True)
            if last:
                break
    """), str(tmp_path), str(tmp_path / "running")], stdout=subprocess.PIPE, text=True)
    try:
        # A scrape before the first death and one after each (it may have begun before it): read
        # here, not counted on: a loaded machine could leave the scraper starting until all had died.
        lines = [scraper.stdout.readline()]
        for _ in range(8):
            retire(_process_that_counts(tmp_path), str(tmp_path))
            lines.append(scraper.stdout.readline())
        (tmp_path / "running").unlink()
        out, _ = scraper.communicate(timeout=60)
    finally:
        scraper.kill()
        scraper.wait()
    assert scraper.returncode == 0
    totals = [float(line) for line in "".join(lines).split() + out.split()]
    assert len(totals) >= 10
    assert all(total in {2.0 * n for n in range(9)} for total in totals)
    assert totals == sorted(totals) and totals[-1] == 16.0


def test_a_fold_that_cannot_write_still_leaves_every_count_in_the_scrape(tmp_path, monkeypatch):
    from prometheus_client.mmap_dict import MmapedDict

    from agentos import metrics_files

    class FullDisk(MmapedDict):        # reads as usual; writing a new archive fails
        def __init__(self, *_):
            raise OSError(28, "No space left on device")
    pids = [_process_that_counts(tmp_path) for _ in range(2)]
    monkeypatch.setattr(metrics_files, "MmapedDict", FullDisk)
    for pid in pids:
        metrics_files.retire(pid, str(tmp_path))          # cannot fold: the files stay, renamed
    assert _metric_files(tmp_path) == sorted(f"{t}_dead-{p}.db" for t in ("counter", "histogram") for p in pids)
    assert "agentos_admission_rejected_total 4.0" in _scrape(tmp_path)


def test_a_dead_process_files_are_renamed_only_under_the_lock_scrapes_take(tmp_path, monkeypatch):
    """A directory listing taken while a file is renamed can miss it under both names: a scrape
    must never list while the supervisor renames a dead process's files."""
    import fcntl

    from agentos import metrics_files
    pid = _process_that_counts(tmp_path)
    held = []
    rename = os.rename

    def checking_rename(src, dst):
        fd = os.open(os.path.join(tmp_path, metrics_files.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)                  # nobody held it: a scrape could have been listing
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        rename(src, dst)
    monkeypatch.setattr(metrics_files.os, "rename", checking_rename)
    metrics_files.retire(pid, str(tmp_path))
    assert held == [True, True]                 # the counter's file and the histogram's
    assert "agentos_admission_rejected_total 2.0" in _scrape(tmp_path)
