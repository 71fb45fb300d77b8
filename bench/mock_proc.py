"""The mock model as a subprocess for benchmarks: its own process group, a port it picks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.server_proc import REPO

START_TIMEOUT_SECS = 20.0
STOP_GRACE_SECS = 5.0


class MockError(RuntimeError):
    pass


def http_json(method: str, url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as resp:
        return json.loads(resp.read())


class MockModel:
    """bench.mock_llm with a given profile; `url` is its base (without /v1)."""

    def __init__(self, ttft_ms: float, tps: float, tokens: int) -> None:
        self.env = dict(os.environ, MOCK_TTFT_MS=str(ttft_ms), MOCK_TPS=str(tps), MOCK_TOKENS=str(tokens))
        self.ideal_turn_ms = ttft_ms + 1000.0 * (tokens - 1) / tps  # the mock's own time for one turn
        self._dir = tempfile.TemporaryDirectory(prefix="bench-mock-")
        self._proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> "MockModel":
        port_file = Path(self._dir.name) / "port"
        log_path = Path(self._dir.name) / "mock.log"
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "bench.mock_llm", "--host", "127.0.0.1", "--port", "0",
                 "--port-file", str(port_file)],
                cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while not port_file.exists():
            if self._proc.poll() is not None or time.monotonic() >= deadline:
                self.__exit__()
                raise MockError(f"the mock did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            for sig, wait_secs in ((signal.SIGTERM, STOP_GRACE_SECS), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self._proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self._proc.wait(wait_secs)
                    break
                except subprocess.TimeoutExpired:
                    continue
            self._proc = None
        self._dir.cleanup()

    def stats(self) -> dict:
        return http_json("GET", f"{self.url}/stats")

    def reset_stats(self) -> None:
        http_json("POST", f"{self.url}/stats/reset")
