"""End-to-end: durable flows on real workers — exactly-once steps through kills, SYNC and ASYNC,
durable sleeps across a full restart, channels, attribute locks, idempotent starts."""
import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp

from broker.sharding import actor_name
from gateway import openapi
from harness import Server, Worker, get_json, wait_until


def start(base, flow, input, headers=None):
    return get_json(f"{base}/v1/flows/{flow}/runs", method="POST", body=json.dumps({"input": input}).encode(),
                    headers={"Content-Type": "application/json", **(headers or {})})


def result(base, run_id, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        status, _, body = get_json(f"{base}/v1/runs/{run_id}?wait=10")
        if body.get("status") in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return body


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_each_committed_step_runs_once_through_worker_actor_and_writer_kills(make_server, make_worker, tmp_path):
    server = make_server()
    make_worker(server, slots=4)
    make_worker(server, slots=4)
    effects = tmp_path / "effects.txt"
    starts = Path(f"{effects}.starts")
    gate = tmp_path / "gate"   # step 1 takes effect once it exists
    status, _, run = start(server.url, "five_steps", {"file": str(effects), "delay": 1.0, "gate": str(gate),
                                                      "gate_step": 1})
    assert status == 201
    run_id = run["run_id"]

    # 1. kill -9 the worker in the middle of step 1 (after its start, before its side effect).
    wait_until(lambda: any(l.startswith("start 1") for l in lines(starts)), 30, "step 1 to start")
    pid = int(next(l for l in lines(starts) if l.startswith("start 1")).split("pid=")[1])
    os.kill(pid, signal.SIGKILL)
    gate.touch()
    # 2. kill -9 the run's actor between steps (after step 2's side effect).
    wait_until(lambda: "step 2" in lines(effects), 60, "step 2 to run on another worker")
    server.kill9(actor_name(run_id, 2))
    # 3. kill -9 the log writer while step 3 runs.
    wait_until(lambda: any(l.startswith("start 3") for l in lines(starts)), 60, "step 3 to start")
    server.kill9("writer/log/0")

    body = result(server.url, run_id)
    assert body["status"] == "completed", body
    assert body["result"] == sum(n * 10 for n in range(5))
    assert sorted(lines(effects)) == [f"step {n}" for n in range(5)]   # once each, committed or not retried
    assert sum(l.startswith("start 1") for l in lines(starts)) == 2      # the killed attempt, then its retry


def test_a_sync_step_is_in_the_log_before_the_next_step_starts(flows_server, tmp_path):
    server = flows_server
    wal = str(server.work_dir / "data" / "wal")
    _, _, run = start(server.url, "sync_then_check", {"file": str(tmp_path / "s.txt"), "wal": wal})
    assert result(server.url, run["run_id"])["result"] is True
    # ASYNC: the flow moves on without waiting for the commit, yet its end waits for it.
    _, _, run = start(server.url, "async_steps", 20)
    done = result(server.url, run["run_id"])
    assert done["status"] == "completed" and done["result"] == sum(i * 2 for i in range(20))


def test_a_durable_sleep_survives_a_full_restart(tmp_path):
    server = Server(tmp_path).start()
    worker = Worker(server).wait_registered()
    marks = tmp_path / "sleep.txt"
    try:
        _, _, run = start(server.url, "sleeper", {"file": str(marks), "secs": 4})
        wait_until(lambda: lines(marks) == ["before"], 30, "the step before the sleep")
        # suspended: the sleep's timer is journaled
        assert get_json(f"{server.url}/v1/runs/{run['run_id']}?wait=30&until=suspended")[2]["status"] == "suspended"
    finally:
        worker.stop()
        assert server.stop() == 0
    server = Server(tmp_path).start()
    worker = Worker(server).wait_registered()
    try:
        body = result(server.url, run["run_id"])
        assert body["status"] == "completed", body
        assert body["result"] >= 4.0
        assert lines(marks) == ["before", "after"]
    finally:
        worker.stop()
        server.stop()


def test_messages_published_before_the_wait_are_each_taken_by_one_wait(flows_server):
    server = flows_server
    _, _, run = start(server.url, "waiter", {"delay": 1.0})
    run_id = run["run_id"]
    for message in ("first", "second", "third"):
        status, _, _ = get_json(f"{server.url}/v1/runs/{run_id}/channels/inbox", method="POST",
                                body=json.dumps({"message": message}).encode())
        assert status == 202
    body = result(server.url, run_id)
    assert body["result"] == ["first", "second"]   # FIFO, one message per wait; "third" stays queued
    assert get_json(f"{server.url}/v1/runs/{run_id}/channels/inbox", method="POST",
                    body=b'{"message": 1}')[0] == 409  # the run has ended


def test_concurrent_lock_and_update_never_loses_an_increment(flows_server):
    server = flows_server
    _, _, run = start(server.url, "with_attrs", {})
    run_id = run["run_id"]

    async def go():
        async with aiohttp.ClientSession() as session:
            async def client(n):
                for _ in range(n):
                    async with session.post(f"{server.url}/v1/runs/{run_id}/attributes/count:update",
                                            json={"handler": "incr", "arg": 1}) as resp:
                        assert resp.status == 200, await resp.text()
            await asyncio.gather(*(client(50) for _ in range(20)))

    asyncio.run(go())
    status, _, body = get_json(f"{server.url}/v1/runs/{run_id}/attributes?keys=count,status")
    assert body["attributes"] == {"count": 1000, "status": "started"}


def test_idempotent_starts_return_the_same_run(flows_server):
    server = flows_server
    first = start(server.url, "async_steps", 3, {"Idempotency-Key": "order-17"})
    again = start(server.url, "async_steps", 3, {"Idempotency-Key": "order-17"})
    assert first[0] == 201 and again[0] == 200
    assert first[2]["run_id"] == again[2]["run_id"] and again[2]["created"] is False
    chosen = get_json(f"{server.url}/v1/flows/async_steps/runs", method="POST",
                      body=json.dumps({"input": 2, "run_id": "my-run-1"}).encode())
    twice = get_json(f"{server.url}/v1/flows/async_steps/runs", method="POST",
                     body=json.dumps({"input": 2, "run_id": "my-run-1"}).encode())
    assert chosen[2]["run_id"] == twice[2]["run_id"] == "my-run-1" and twice[2]["created"] is False
    other_input = start(server.url, "async_steps", 4, {"Idempotency-Key": "order-17"})
    assert other_input[0] == 409 and "another input" in other_input[2]["error"]["message"]
    other_flow = get_json(f"{server.url}/v1/flows/five_steps/runs", method="POST",
                          body=json.dumps({"input": 2, "run_id": "my-run-1"}).encode())
    assert other_flow[0] == 409 and "another flow" in other_flow[2]["error"]["message"]
    assert result(server.url, "my-run-1")["result"] == 2


def test_failures_children_cancel_and_non_determinism(flows_server, tmp_path):
    server = flows_server
    base = server.url
    failed = result(base, start(base, "failing", {})[2]["run_id"])
    assert failed["status"] == "failed" and "after 2 attempts" in failed["error"] and "boom" in failed["error"]
    assert result(base, start(base, "flaky", {"file": str(tmp_path / "flaky")})[2]["run_id"])["result"] == 2
    assert result(base, start(base, "parent", 3)[2]["run_id"])["result"] == 6 + 8
    waiting = start(base, "waiter", {})[2]["run_id"]
    began = time.monotonic()
    suspended = get_json(f"{base}/v1/runs/{waiting}?wait=30&until=suspended")[2]
    assert suspended["status"] == "suspended" and time.monotonic() - began < 25  # answered at the wait, not the end
    assert get_json(f"{base}/v1/runs/{waiting}?wait=1&until=sleeping")[0] == 400
    cancelled = get_json(f"{base}/v1/runs/{waiting}:cancel", method="POST")
    assert cancelled[2]["status"] == "cancelled"
    # a cancelled parent's child is cancelled too (it slept on for its hour)
    parent = start(base, "parent_of_sleeper", {"child": "kid-of-cancelled"})[2]["run_id"]
    wait_until(lambda: get_json(f"{base}/v1/runs/kid-of-cancelled")[2].get("status") == "suspended", 20, "the child")
    assert get_json(f"{base}/v1/runs/{parent}:cancel", method="POST")[2]["status"] == "cancelled"
    wait_until(lambda: get_json(f"{base}/v1/runs/kid-of-cancelled")[2].get("status") == "cancelled", 20,
               "the child's cancel")
    # a child whose run id names another flow's run fails the parent's wait (it waited for good)
    get_json(f"{base}/v1/flows/async_steps/runs", method="POST", body=b'{"input": 1, "run_id": "taken-id"}')
    clash = result(base, start(base, "parent_of_sleeper", {"child": "taken-id"})[2]["run_id"], timeout=30)
    assert clash["status"] == "failed" and "another flow" in clash["error"], clash
    marker = tmp_path / "branch"
    branchy = start(base, "branchy", {"file": str(marker)})[2]["run_id"]
    # suspended: its step "first" is journaled and it waits on "go"
    assert get_json(f"{base}/v1/runs/{branchy}?wait=30&until=suspended")[2]["status"] == "suspended"
    marker.write_text("now the code takes the other branch")
    get_json(f"{base}/v1/runs/{branchy}/channels/go", method="POST", body=b"{}")
    body = result(base, branchy)
    assert body["status"] == "failed" and "NonDeterministic" in body["error"] and "'first'" in body["error"]
    assert get_json(f"{base}/v1/runs/no-such-run")[0] == 404
    assert get_json(f"{base}/v1/flows/bad%20name/runs", method="POST", body=b"{}")[0] == 400


def test_a_run_cancelled_right_after_its_start_stops_its_step_in_flight(make_server, make_worker, tmp_path):
    """Cancels 0-30 ms after the starts: before the actor has heard which worker runs them, the
    scheduler passes the cancel on, so no step's side effect lands after the cancel was answered
    (each first step waits until every cancel is answered), and the worker's two slots are free
    afterwards."""
    server = make_server()
    make_worker(server, slots=2)
    base = server.url
    runs = []
    gate = tmp_path / "gate"   # opened once every cancel is answered: a step still running then takes effect
    for i in range(10):
        status, _, body = start(base, "five_steps", {"file": str(tmp_path / f"run{i}"), "delay": 0.3,
                                                     "gate": str(gate), "gate_step": 0})
        assert status in (200, 201), body
        time.sleep(i * 0.003)
        status, _, cancelled = get_json(f"{base}/v1/runs/{body['run_id']}:cancel", method="POST")
        assert (status, cancelled["status"]) == (200, "cancelled")
        runs.append(body["run_id"])
    gate.touch()
    later = start(base, "five_steps", {"file": str(tmp_path / "later"), "delay": 0.01})[2]["run_id"]
    assert result(base, later, timeout=30)["status"] == "completed"
    assert [get_json(f"{base}/v1/runs/{run_id}")[2]["status"] for run_id in runs] == ["cancelled"] * 10
    assert lines(tmp_path / "later") == [f"step {n}" for n in range(5)]
    assert not [i for i in range(10) if lines(tmp_path / f"run{i}")], "a cancelled run's step took effect"


def test_bad_updates_and_results_fail_clearly_and_leave_the_run_usable(flows_server):
    """Each of these once hung: an unknown handler held the run's lock for good (every later update
    timed out), and a result msgpack cannot carry had its run retried for ever."""
    server = flows_server
    base = server.url
    run_id = start(base, "with_attrs", {})[2]["run_id"]
    wait_until(lambda: get_json(f"{base}/v1/runs/{run_id}/attributes")[2].get("attributes") == {"status": "started"},
               20, "the run to start")

    def update(body: dict) -> tuple[int, dict]:
        status, _, answer = get_json(f"{base}/v1/runs/{run_id}/attributes/count:update", method="POST",
                                     body=json.dumps(body).encode())
        return status, answer

    status, answer = update({"handler": "no_such_handler", "arg": 1})
    assert status == 422 and "no worker has an update handler named 'no_such_handler'" in answer["error"]["message"]
    status, answer = update({"handler": "unencodable"})
    assert status == 422 and "msgpack-serialisable" in answer["error"]["message"]
    assert update({"handler": "incr", "arg": 2}) == (200, {"run_id": run_id, "key": "count", "value": 2})
    status, answer = update({"handler": "incr", "args": 2})           # misspelt: not a silent null
    assert status == 400 and "'args'" in answer["error"]["message"]
    status, _, answer = get_json(f"{base}/v1/runs/{run_id}/channels/finish", method="POST", body=b'{"msg": "x"}')
    assert status == 400 and answer["error"]["code"] == "invalid_body"
    assert get_json(f"{base}/v1/runs/{run_id}/channels/finish", method="POST", body=b'{"message": "x"}')[0] == 202
    assert result(base, run_id)["result"] == {"status": "done", "count": 2}
    status, answer = update({"handler": "incr", "arg": 1})             # as a publish to an ended run is
    assert status == 409 and answer["error"]["code"] == "ended"
    assert "409" in openapi.PATHS["/v1/runs/{run_id}/attributes/{key}:update"]["post"]["responses"]  # as /openapi.json says
    assert get_json(f"{base}/v1/runs/{run_id}/attributes")[2]["attributes"]["count"] == 2

    failed = result(base, start(base, "unencodable", {})[2]["run_id"], timeout=30)
    assert failed["status"] == "failed" and "the result of flow 'unencodable' must be msgpack-serialisable" in failed["error"]
    raw = result(base, start(base, "returns_bytes", {})[2]["run_id"], timeout=30)
    assert raw["status"] == "failed" and "the result of flow 'returns_bytes' must be JSON-serialisable" in raw["error"]
    # a wait with timeout=0 times out at once when no message is there (it was taken as no timeout)
    polled = result(base, start(base, "waiter", {"timeout": 0})[2]["run_id"], timeout=30)
    assert polled["status"] == "failed" and "WaitTimeout" in polled["error"]


def test_big_values_are_refused_and_a_run_holds_at_most_its_journal_limit(flows_server):
    """A 50 MB result once wedged writer/store (DuckDB refused the batch, retried for ever); a
    run of ~100 MB of step results cut its actor off the bus at its next execution (the offer
    carrying its journal was over the broker's message limit) and never ran again."""
    server = flows_server
    base = server.url
    too_big = result(base, start(base, "big_steps", {"steps": 1, "n": 5 << 20})[2]["run_id"])
    assert too_big["status"] == "failed" and "a run records values of at most 4,194,304 bytes" in too_big["error"]
    # 7 × 3 MB: under the run's limit; its next execution replays them all from one offer
    kept = start(base, "big_steps", {"steps": 7, "n": 3 << 20})[2]["run_id"]
    assert get_json(f"{base}/v1/runs/{kept}?wait=60&until=suspended")[2]["status"] == "suspended"
    assert get_json(f"{base}/v1/runs/{kept}/channels/go", method="POST", body=b'{"message": 1}')[0] == 202
    done = result(base, kept)
    assert done["started_at"] <= done.pop("ended_at") and done.pop("started_at") > 0
    assert done == {"run_id": kept, "status": "completed", "flow": "big_steps", "result": 7 * (3 << 20)}
    # 12 × 3 MB: past it, the run fails once its journal is full
    over = result(base, start(base, "big_steps", {"steps": 12, "n": 3 << 20})[2]["run_id"])
    assert over["status"] == "failed" and "the run's journal passed 33,554,432 bytes" in over["error"]
    assert result(base, start(base, "async_steps", 3)[2]["run_id"])["result"] == 6   # the actors go on
    # A transcript read waits until writer/store has loaded all that was durable when it came in
    # (read-your-writes), the big values too: a wedged store would leave it unanswered. (Not the
    # lag gauge: every scrape is a request, whose access row is a record the store loads a second later.)
    status, _, body = get_json(f"{base}/v1/sessions/after-the-big-values/messages")
    assert (status, body["error"]["code"]) == (404, "not_found"), body


def test_ended_runs_leave_the_actors_memory_with_what_refers_to_them(make_server, make_worker, tmp_path):
    """Each run's worker stayed in a table for good: one entry per run ever executed."""
    server = make_server({"storage": {"retention_secs": 2}})   # ended runs stay in memory this long
    make_worker(server)
    # long enough for their worker to report them alive (about once a second)
    runs = [start(server.url, "five_steps", {"file": str(tmp_path / f"r{i}"), "delay": 0.4})[2]["run_id"]
            for i in range(6)]
    assert all(result(server.url, run_id)["result"] == 100 for run_id in runs)

    def flows_in_actors() -> list[dict]:
        rows = server.status()["processes"]
        return [r["stats"]["flows"] for r in rows if r["name"].startswith("actor/")]

    wait_until(lambda: all(f["runs"] == {} and f["run_workers"] == 0 for f in flows_in_actors()), 30,
               f"the ended runs to leave memory ({flows_in_actors()})")


def test_a_workers_blocking_steps_run_as_many_at_once_as_it_has_slots(make_server, make_worker, tmp_path):
    """Plain steps ran on asyncio's default pool: at most 32 threads (cpu count + 4: six here),
    whatever --slots said."""
    server = make_server()
    make_worker(server, slots=48)
    marks, gate = tmp_path / "marks", tmp_path / "gate"   # the steps block until the test opens the gate
    args = {"seconds": 60, "gate": str(gate), "marks": str(marks)}
    runs = [start(server.url, "one_blocking_step", args)[2]["run_id"] for _ in range(40)]
    try:
        wait_until(lambda: len(lines(marks)) == 40, 30, f"40 steps on threads at once ({len(lines(marks))})")
    finally:
        gate.touch()
    peaks = [result(server.url, run_id)["result"] for run_id in runs]
    assert max(peaks) == 40, peaks


def test_a_run_whose_code_kills_its_workers_fails_after_a_few(make_server, make_worker):
    """It was given to the next worker for good: a poison run took every worker down in turn."""
    from actors.flow_runs import MAX_LOST_EXECUTIONS
    from bench.server_proc import ServerError

    server = make_server()
    run_id = None
    for _ in range(MAX_LOST_EXECUTIONS):    # each worker in turn gets the run, and dies of it
        try:
            worker = make_worker(server)
        except ServerError:
            continue     # the run was waiting for it: it went down while it said hello
        if run_id is None:
            run_id = start(server.url, "kills_its_worker", {})[2]["run_id"]
        wait_until(lambda: worker.proc.poll() is not None, 30, "the run to kill its worker")
    body = get_json(f"{server.url}/v1/runs/{run_id}?wait=15")[2]
    assert body["status"] == "failed" and f"its last {MAX_LOST_EXECUTIONS} executions died" in body["error"], body


def test_a_worker_stops_at_sigterm_though_a_blocking_step_runs(make_server, make_worker):
    """The interpreter waited at exit for the step's thread: an hour for an hour-long step."""
    import signal

    server = make_server()
    worker = make_worker(server)
    marks = server.work_dir / "blocking-marks"
    run_id = start(server.url, "one_blocking_step", {"seconds": 3600, "marks": str(marks)})[2]["run_id"]
    wait_until(lambda: marks.exists(), 20, "the step to block on its thread")
    worker.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: worker.proc.poll() is not None, 20, "the worker to stop")
    assert "blocking step(s) still on their threads" in worker.log_path.read_text()
    # (its run would take the next worker's slot at once: the stopped one said it left)
    assert get_json(f"{server.url}/v1/runs/{run_id}:cancel", method="POST")[0] == 200
    # run in a terminal, a worker stops on Ctrl-C as on SIGTERM (it ignored SIGINT, as the tree's
    # children do, whose Ctrl-C is the supervisor's)
    idle = make_worker(server)
    idle.proc.send_signal(signal.SIGINT)
    wait_until(lambda: idle.proc.poll() is not None, 20, "the worker to stop on SIGINT")
    said = idle.log_path.read_text()
    assert idle.proc.returncode == 0 and "stopping: 0 step(s)" in said
    assert "reached the server at ipc://" in said   # it says so, and would warn if none answered


def test_a_blocking_step_past_its_timeout_does_not_hold_up_its_retry(make_server, make_worker, tmp_path):
    """Real processes, a worker of one slot: the step's first attempt hangs (20 s) past its 0.5 s
    timeout and its thread cannot be stopped. The retry ran on the slot's only thread behind it,
    timed out without starting, and so did the next: the run failed. Now the retry starts at once."""
    server = make_server()
    make_worker(server, slots=1)
    marker = tmp_path / "stuck.marker"
    t0 = time.monotonic()
    run_id = start(server.url, "stuck_step_then_retry", {"marker": str(marker), "seconds": 20, "timeout": 0.5})[2]["run_id"]
    body = result(server.url, run_id, timeout=30)
    assert body["status"] == "completed" and body["result"] == "done", body
    assert time.monotonic() - t0 < 15, "the retry waited for the stuck thread"
    assert lines(marker) == ["called", "called"]
