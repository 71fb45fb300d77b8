"""End-to-end: a worker stopped with SIGTERM while it runs a step says goodbye. The scheduler
forgets it at once (an INFO line, not the WARNING of a worker that went silent), and the run's
step goes back to its actor and runs on the next worker."""
import json

from harness import get_json, wait_until


def test_a_worker_stopped_mid_step_leaves_and_its_run_completes_on_the_next(make_server, make_worker, tmp_path):
    server = make_server()
    first = make_worker(server)
    marks = tmp_path / "occupied.txt"
    status, _, run = get_json(f"{server.url}/v1/flows/queued/runs", method="POST",
                              body=json.dumps({"input": {"file": str(marks), "secs": 1.0}}).encode())
    assert status == 201, run
    wait_until(lambda: marks.exists() and "+" in marks.read_text(), 30, "the step to begin")
    first.stop()                                     # SIGTERM, mid-step
    wait_until(lambda: "left; its tasks go back to their actors" in server.log(), 10, "the scheduler to hear it leave")
    make_worker(server)
    done = get_json(f"{server.url}/v1/runs/{run['run_id']}?wait=30")[2]
    assert done["status"] == "completed", done
    assert "stopped answering" not in server.log()   # it was not taken for dead
    assert first.proc.poll() is not None
