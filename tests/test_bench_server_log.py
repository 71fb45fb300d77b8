"""What a benchmark run keeps of its tree's log (bench/server_log.py, bench/checkpoint_report.py)."""
from __future__ import annotations

from bench import server_log
from bench.checkpoint_report import summary_markdown, window_report
from bench.server_log import LogWatch, logged_errors

INFO = "2026-12-03 22:15:01,002 agent-os.broker INFO routing on ipc:///tmp/x\n"
SLOW = ("2026-12-03 22:15:02,003 agent-os.storage WARNING log /tmp/wal/0: a batch of 9 records took 0.772 s "
        "(writing 0.000, fdatasync 0.771)\n")
ERROR = "2026-12-03 22:15:03,004 agent-os.gateway ERROR unhandled error in PUT s/k\n"
TRACE = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nOSError: [Errno 5] I/O error\n"


def test_a_watch_keeps_the_warnings_and_errors_written_after_it_began(tmp_path):
    path = tmp_path / "server.log"
    path.write_text(SLOW)                           # before the watch: not this run's
    watch = LogWatch(path)
    with open(path, "a") as log:
        log.write(INFO + SLOW + ERROR + TRACE + INFO + "2026-12-03 22:15:04,005 agent-os.gateway WARN")
    assert watch.notable() == [SLOW.rstrip("\n"), ERROR.rstrip("\n"), *TRACE.rstrip("\n").split("\n")]
    with open(path, "a") as log:                    # the unfinished line is read once it ends
        log.write("ING slow answer\n" + INFO)
    assert watch.notable() == ["2026-12-03 22:15:04,005 agent-os.gateway WARNING slow answer"]
    assert watch.notable() == []


def test_a_watch_keeps_a_bounded_number_of_bounded_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(server_log, "MAX_LINES", 3)
    path = tmp_path / "server.log"
    watch = LogWatch(path)                          # the file comes later: it is read from its start
    assert watch.notable() == []
    long = SLOW.rstrip("\n") + "x" * 1000
    path.write_text((long + "\n") * 5)
    kept = watch.notable()
    assert len(kept) == 4 and kept[-1] == "… (more not kept)"
    assert kept[0] == long[:server_log.MAX_LINE_CHARS] + " …"


def test_the_summary_quotes_each_run_that_warned_under_its_label():
    def row(run: int, lines: list[str] | None) -> dict:
        summary = {"p50": 1.0, "p95": 2.0, "p99": 3.0, "mean": 1.0, "max": 3.0, "n": 10}
        return {"target": "agentos", "scale": "1k", "mode": "mixed", "run": run, "checkpoints": 1000,
                "duration_secs": 1.0, "checkpoints_per_sec": 1000.0, "commit_ms": summary, "task_ms": summary,
                "read_ms": summary, "errors": {}, "errors_total": 0, "read_anomalies": 0, "reads": {},
                "phase": "overwrite", "windows": window_report([0.5], [1.0], 1.0), "server_log": lines}

    config = {"bench": {"workers": 10, "repeat": 2}}
    text = summary_markdown([row(1, [SLOW.rstrip("\n")]), row(2, [])], config)
    assert "## What our server warned of during the runs" in text
    assert "agentos 1k mixed R1:\n\n```\n" + SLOW + "```" in text
    assert "mixed R2:\n" not in text
    assert "warned of" not in summary_markdown([row(1, []), row(2, None)], config)


def test_a_whole_logs_errors_are_counted_past_the_lines_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(server_log, "MAX_LINES", 2)
    path = tmp_path / "server.log"
    path.write_text(INFO + SLOW + ERROR + TRACE + SLOW + ERROR + ERROR.replace(" ERROR ", " CRITICAL "))
    count, lines = logged_errors(path)
    assert count == 3                               # the WARNINGs are not errors
    assert lines == [ERROR.rstrip("\n"), TRACE.split("\n")[0], "… (more not kept)"]
    assert logged_errors(tmp_path / "missing.log") == (0, [])
