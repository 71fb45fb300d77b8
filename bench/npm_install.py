"""One pinned `npm install` into a private cache folder: what both benchmark peers need once.

Owns: the npm command line (pinned, exact, no install scripts, no audit or fund calls) and
turning its failures into the caller's error type. Never does: pick or check the binary that
npm installed; each peer knows its own package layout.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ERROR_TAIL_CHARS = 4000


def npm_command(npm: str, cache_dir: Path, spec: str) -> list[str]:
    # --ignore-scripts: the wrappers' install scripts only link the native build or phone home;
    # the peers run the platform package's binary directly.
    return [npm, "install", "--prefix", str(cache_dir), "--ignore-scripts", "--no-audit",
            "--no-fund", "--save-exact", spec]


def npm_install(cache_dir: Path, spec: str, timeout_secs: float,
                error: type[Exception] = RuntimeError) -> None:
    """`npm install spec` into `cache_dir`; raises `error` saying what went wrong."""
    npm = shutil.which("npm")
    if npm is None:
        raise error(f"npm is not on PATH; it is needed once to install {spec}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = npm_command(npm, cache_dir, spec)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=timeout_secs)
    except subprocess.TimeoutExpired as exc:
        raise error(f"npm install did not finish in {timeout_secs:g}s") from exc
    if done.returncode != 0:
        raise error(f"{' '.join(cmd)} failed with {done.returncode}:\n"
                    f"{done.stderr[-ERROR_TAIL_CHARS:]}")
