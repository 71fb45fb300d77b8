"""End-to-end: `agent-os worker --drain SECS`. Stopped (SIGTERM), a draining worker takes no new
task — a run started meanwhile goes to another worker — and lets the run it is executing go on to
its end, its steps never cut short. A second signal ends the drain at once: the step running is
cut short as without one (interrupted, not failed) and its run goes on on the next worker."""
import json
import os
import re
import signal

import pytest

from harness import get_json, scrape, wait_until


def _start(server, body: dict) -> str:
    status, _, run = get_json(f"{server.url}/v1/flows/five_steps/runs", method="POST", body=json.dumps({"input": body}).encode())
    assert status == 201, run
    return run["run_id"]


def _pids(starts) -> set[int]:
    return {int(pid) for pid in re.findall(r"pid=(\d+)", starts.read_text())}


def test_a_draining_worker_takes_no_new_run_and_finishes_the_one_it_runs(make_server, make_worker, tmp_path):
    server = make_server()
    old = make_worker(server, args=("--drain", "60"))
    first, gate = tmp_path / "first.txt", tmp_path / "gate"
    run = _start(server, {"file": str(first), "delay": 0.05, "gate_step": 1, "gate": str(gate)})
    wait_until(lambda: "start 1" in (tmp_path / "first.txt.starts").read_text()
               if (tmp_path / "first.txt.starts").exists() else False, 20, "the gated step to begin")
    os.kill(old.pid, signal.SIGTERM)
    wait_until(lambda: "draining: 1 step(s) and task(s) in flight" in old.log_path.read_text(), 10, "the drain")

    new = make_worker(server)
    listed = {w["name"].rsplit("-", 1)[1]: w for w in get_json(f"{server.url}/v1/workers")[2]["workers"]}
    assert set(listed) == {str(old.pid), str(new.pid)}, listed
    draining, fresh = listed[str(old.pid)], listed[str(new.pid)]
    assert (draining["draining"], draining["slots"], draining["running"]) == (True, 0, 1), draining
    assert (fresh["draining"], fresh["slots"], fresh["running"]) == (False, 16, 0), fresh
    assert "five_steps" in fresh["flows"] and fresh["tools"] == ["get_weather", "read_raw", "search"]
    assert fresh["update_handlers"] == ["incr", "unencodable"]
    want = {'agentos_workers{state="serving"}': 1, 'agentos_workers{state="draining"}': 1,
            'agentos_worker_slots{state="busy"}': 0, 'agentos_worker_slots{state="free"}': 16}
    wait_until(lambda: want.items() <= scrape(server.url).items(), 10, "the workers' gauges")
    second = tmp_path / "second.txt"
    other = _start(server, {"file": str(second), "delay": 0.05})
    done = get_json(f"{server.url}/v1/runs/{other}?wait=30")[2]
    assert done["status"] == "completed", done
    assert _pids(tmp_path / "second.txt.starts") == {new.pid}      # none of it on the draining worker
    assert old.proc.poll() is None                                  # still draining: its run is not done

    gate.touch()
    done = get_json(f"{server.url}/v1/runs/{run}?wait=30")[2]
    assert done["status"] == "completed" and done["result"] == 100, done
    assert _pids(tmp_path / "first.txt.starts") == {old.pid}
    steps = get_json(f"{server.url}/v1/runs/{run}/steps")[2]["steps"]
    assert [(s["attempts"], s.get("interrupted", 0)) for s in steps] == [(1, 0)] * 5, steps
    assert old.proc.wait(15) == 0                                   # it stops once drained
    assert "drained: nothing in flight" in old.log_path.read_text()
    assert "left; its tasks go to the next worker" in server.log()


def test_a_second_signal_ends_the_drain_and_the_step_goes_on_elsewhere(make_server, make_worker, tmp_path):
    server = make_server()
    old = make_worker(server, args=("--drain", "60"))
    marks, gate = tmp_path / "marks.txt", tmp_path / "gate"
    run = _start(server, {"file": str(marks), "delay": 0.05, "gate_step": 2, "gate": str(gate)})
    starts = tmp_path / "marks.txt.starts"
    wait_until(lambda: starts.exists() and "start 2" in starts.read_text(), 20, "the gated step to begin")
    os.kill(old.pid, signal.SIGTERM)
    wait_until(lambda: "draining" in old.log_path.read_text(), 10, "the drain")
    os.kill(old.pid, signal.SIGTERM)
    assert old.proc.wait(15) == 0
    assert "drain over (signalled again) with 1 still in flight" in old.log_path.read_text()

    new = make_worker(server)
    gate.touch()
    done = get_json(f"{server.url}/v1/runs/{run}?wait=30")[2]
    assert done["status"] == "completed" and done["result"] == 100, done
    steps = get_json(f"{server.url}/v1/runs/{run}/steps")[2]["steps"]
    assert (steps[2]["attempts"], steps[2].get("interrupted")) == (2, 1), steps[2]
    assert _pids(starts) == {old.pid, new.pid}


def test_the_drain_option_takes_seconds_and_refuses_anything_else(capsys):
    from agentos.cli import build_parser
    parser = build_parser()
    assert parser.parse_args(["worker", "m"]).drain == 0.0
    assert parser.parse_args(["worker", "m", "--drain", "2.5"]).drain == 2.5
    for bad in ("abc", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["worker", "m", "--drain", bad])
        assert f"--drain takes seconds, 0 or more: '{bad}'" in capsys.readouterr().err
