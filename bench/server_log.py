"""What our server logged above INFO while a benchmark run went on, kept in the run's row.

A benchmark's tree goes with its temporary directory when the command ends (gigabytes nobody
reads again), and its log with it. But a run that stalled is explained, if at all, by what the
tree warned of meanwhile: storage/slow_batches.py names the part of a slow batch that took the
time (the writes, the fdatasync, a rotation, or outside the writing call). A 1k run once did 431
checkpoints/s with five fdatasyncs over 100 ms and the machine three-quarters idle, and nothing
was left to say why (bench/results/2026-12-03-checkpoints-dec03-thirtieth/). So each run's row
keeps the lines at WARNING or above that its tree wrote during the run, with the traceback
lines after them, at most MAX_LINES, and the summaries quote them under the run's label
(`section`). The checkpoint benchmark keeps them for each run, the turn sweep for each round.
The chaos benchmark, which keeps its tree's whole logs, counts their errors (`logged_errors`).
"""
from __future__ import annotations

import re
from pathlib import Path

# agentos/service.py's log format: "2026-12-03 22:27:22,138 agent-os.supervisor WARNING message"
_STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_NOTABLE = re.compile(r"\S+ \S+ \S+ (WARNING|ERROR|CRITICAL) ")
_ERRORS = re.compile(r"\S+ \S+ \S+ (ERROR|CRITICAL) ")
MAX_LINES = 40
MAX_LINE_CHARS = 500


class LogWatch:
    """Reads a log file on from where it stood when made (or last read)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.offset = self.path.stat().st_size
        except OSError:
            self.offset = 0

    def notable(self) -> list[str]:
        """The lines at WARNING or above written since the last call (a line not yet ended waits
        for the next), each with the unstamped lines that follow it (a traceback)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        whole = data.rfind(b"\n") + 1
        self.offset += whole
        return _kept(data[:whole].decode("utf-8", errors="replace"), _NOTABLE)[1]


def logged_errors(path: str | Path) -> tuple[int, list[str]]:
    """How many ERROR or CRITICAL records a whole log holds, and the first of them (bounded as
    above): a chaos run's server log is thousands of lines of expected WARNINGs (each kill)."""
    try:
        text = Path(path).read_text("utf-8", errors="replace")
    except OSError:
        return 0, []
    return _kept(text, _ERRORS)


def _kept(text: str, level: re.Pattern) -> tuple[int, list[str]]:
    """(records at `level`, their lines — each with the unstamped lines after it — at most MAX_LINES)."""
    count, out, keep = 0, [], False
    for line in text.splitlines():
        if _STAMPED.match(line):
            keep = level.match(line) is not None
            count += keep
        if not keep or len(out) > MAX_LINES:
            continue
        if len(out) == MAX_LINES:
            out.append("… (more not kept)")
            continue
        out.append(line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …")
    return count, out


def section(labelled: list[tuple[str, list[str] | None]], runs: str = "runs") -> str:
    """The summary's section quoting each run's kept lines under its label ('' if none has any)."""
    blocks = [f"{label}:\n\n```\n" + "\n".join(lines) + "\n```" for label, lines in labelled if lines]
    if not blocks:
        return ""
    return "\n\n".join([
        f"## What our server warned of during the {runs}",
        (f"The lines at WARNING or above each tree wrote while one of its {runs} went on, from just "
         f"before it to just after (bench/server_log.py); {runs} not listed logged none. A batch over "
         "0.5 s is logged with where its time went (storage/slow_batches.py)."),
        *blocks]) + "\n"
