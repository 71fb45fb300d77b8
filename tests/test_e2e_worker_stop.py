"""End-to-end: a worker stopped with SIGTERM while it runs a step says goodbye. The scheduler
forgets it at once (an INFO line, not the WARNING of a worker that went silent), and the run's
step goes back to its actor and runs on the next worker. A stop like that is not the step's
failure nor a death: a run whose workers are stopped under its step more times than the step
has attempts, and than a run may lose executions to dying workers (a deploy after another),
still completes, its step's attempts cut short listed as interrupted. A tool call cut short the
same way waits for the next worker that has the tool, one that comes after a while included."""
import asyncio
import json
import time

import aiohttp

from actors.flow_runs import EXEC_GRACE_SECS, MAX_LOST_EXECUTIONS
from harness import get_json, run_turn, scrape, wait_until


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
        wait_until(lambda: server.log().count("left; its tasks go to the next worker") == stop, 10,
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


def test_a_tool_call_whose_only_worker_stops_runs_on_the_worker_that_comes_next(make_server, make_worker, tmp_path):
    """A deploy of the one worker that has a tool: its call in flight went back to the scheduler
    only with its actor's watchdog, and, no worker having the tool by then, failed at once ("no
    worker has a tool named 'search'"): the model went on without it."""
    marker = tmp_path / "tools.txt"
    server = make_server()
    old = make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_TOOL_DELAY": "600"})
    sid = "agent-deploy"

    def deploy():
        wait_until(lambda: marker.exists() and "search deploy me" in marker.read_text(), 10, "the tool to start")
        old.stop()
        time.sleep(EXEC_GRACE_SECS + 2)   # past its actor's watchdog: the call is sent again meanwhile
        make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker)})

    async def go():
        async def on_event(name, result):
            if name == "tool" and result.events[-1][1] == {**result.events[-1][1], "phase": "call", "name": "search"}:
                await asyncio.get_running_loop().run_in_executor(None, deploy)

        async with aiohttp.ClientSession() as s:
            return await run_turn(s, server.url, sid, "deploy me [[mock tool_calls=search ttft_ms=20]]",
                                  on_event=on_event, timeout=60)

    result = asyncio.run(go())
    assert result.terminal == "turn.completed", result.events[-1]
    answer = next(d for e, d in result.events if e == "tool" and d["phase"] == "result")
    assert answer["ok"] is True, answer
    assert marker.read_text().splitlines() == ["search deploy me", "search cancelled deploy me",
                                               "search deploy me", "search done deploy me"]
