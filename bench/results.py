"""The results folder every benchmark writes: `bench/results/<date>-<name>/`.

A run is the project's record, like a paper's table: its config, one row per point (JSON lines),
a `summary.md` with the table, and PNG plots. This module owns the folder layout and the
markdown table; each benchmark owns what goes in its rows.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable, Sequence

RESULTS_ROOT = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["mem_gib"] = round(int(mem) / 1024 / 1024, 1)
    except OSError:
        pass
    return info


class ResultsDir:
    def __init__(self, name: str, root: Path | None = None, date: str | None = None) -> None:
        date = date or _dt.date.today().isoformat()
        self.path = (root or RESULTS_ROOT) / f"{date}-{name}"
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict[str, Any]) -> Path:
        """config.json; `started_at` is now unless `config` says when the run began (a bench that
        writes its folder only at the end)."""
        data = {"machine": machine(), "started_at": _dt.datetime.now().isoformat(timespec="seconds"), **config}
        return self._write_json("config.json", data)

    def write_rows(self, rows: Iterable[dict[str, Any]], name: str = "rows.jsonl") -> Path:
        path = self.path / name
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        return path

    def append_row(self, row: dict[str, Any], name: str = "rows.jsonl") -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def write_summary(self, text: str) -> Path:
        path = self.path / "summary.md"
        path.write_text(text if text.endswith("\n") else text + "\n")
        return path

    def _write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return path

    def figure_path(self, name: str) -> Path:
        return self.path / name


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display on these machines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_rounds(path: Path, panels: list[tuple[str, dict[str, list[tuple[int, float]]]]], ylabel: str) -> None:
    """Side-by-side runs: one panel per (title, {arm: [(round, value), ...]}), a line per arm."""
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.8 * len(panels)), squeeze=False)
    for ax, (title, series) in zip(axes[:, 0], panels):
        for label, points in series.items():
            points = sorted(points)
            ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
