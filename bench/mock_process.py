"""The bundled mock model as a child of the supervisor (when `provider.base_url` is empty).

Its profile comes from the `mock` config section; a restarted mock binds the port it had.
"""
from __future__ import annotations

import logging
import os

from agentos.config import Config
from agentos.rundir import RunDir


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    from bench import mock_llm

    os.environ["MOCK_TTFT_MS"] = str(config.mock.ttft_ms)
    os.environ["MOCK_TPS"] = str(config.mock.tps)
    os.environ["MOCK_TOKENS"] = str(config.mock.tokens)
    port = run_dir.read_port("mock-llm") or config.mock.port
    return mock_llm.main(["--host", "127.0.0.1", "--port", str(port),
                          "--port-file", str(run_dir.port_file("mock-llm"))])
