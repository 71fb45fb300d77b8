"""`agent-os trace` where no server runs: it says so, and waits for one (the e2e trace test in
tests/test_e2e_turns.py checks it says nothing of the kind beside a running server)."""
import time

import yaml

from agentos import config as config_mod
from agentos import trace


def test_a_trace_with_no_server_says_so_and_waits_for_one(tmp_path, capsys):
    path = tmp_path / "agent-os.yaml"
    path.write_text(yaml.safe_dump({"storage": {"dir": str(tmp_path / "data")},
                                    "kernel": {"run_dir": str(tmp_path / "run")}}))
    started = time.monotonic()
    assert trace.main(config_mod.load(path), timeout_secs=0.5) == 0
    assert time.monotonic() - started >= 0.5   # it waited out its timeout rather than giving up
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == f"agent-os trace: no server is running (run dir {tmp_path / 'run'}); waiting for one to start\n"
