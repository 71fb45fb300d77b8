"""End-to-end: a worker stopped with SIGTERM while it runs a step says goodbye. The scheduler
forgets it at once (an INFO line, not the WARNING of a worker that went silent), and the run's
step goes back to its actor and runs on the next worker. A stop like that is not the step's
failure nor a death: a run whose workers are stopped under its step more times than the step
has attempts, and than a run may lose executions to dying workers (a deploy after another),
still completes, its step's attempts cut short listed as interrupted."""
import json

from actors.flow_runs import MAX_LOST_EXECUTIONS
from harness import get_json, scrape, wait_until


def test_workers_stopped_mid_step_leave_and_their_run_completes_on_the_next(make_server, make_worker, tmp_path):
    server = make_server()
    marks = tmp_path / "occupied.txt"
    workers = [make_worker(server)]
    status, _, run = get_json(f"{server.url}/v1/flows/queued/runs", method="POST",
                              body=json.dumps({"input": {"file": str(marks), "secs": 1.0}}).encode())
    assert status == 201, run
    stops = MAX_LOST_EXECUTIONS + 1   # (and more than the step's 3 attempts)
    for stop in range(1, stops + 1):
        wait_until(lambda: marks.exists() and marks.read_text().count("+") == stop, 30, f"attempt {stop} to begin")
        workers[-1].stop()                           # SIGTERM, mid-step
        wait_until(lambda: server.log().count("left; its tasks go back to their actors") == stop, 10,
                   "the scheduler to hear it leave")
        workers.append(make_worker(server))
    done = get_json(f"{server.url}/v1/runs/{run['run_id']}?wait=30")[2]
    assert done["status"] == "completed", done
    (step,) = get_json(f"{server.url}/v1/runs/{run['run_id']}/steps")[2]["steps"]
    assert (step["status"], step["attempts"], step["interrupted"]) == ("completed", stops + 1, stops), step
    wait_until(lambda: scrape(server.url).get('agentos_flow_steps_total{outcome="interrupted"}') == stops, 10,
               "the interrupted attempts counted")
    assert "stopped answering" not in server.log()   # none was taken for dead
    assert all(worker.proc.poll() is not None for worker in workers[:-1])
