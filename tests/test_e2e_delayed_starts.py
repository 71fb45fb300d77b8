"""End-to-end: a start with `delay_secs` or `start_at` makes the run at once (201, `scheduled`,
its `start_at`) and runs it from that time on — not before, once, also when its actor was killed
-9 while it waited; one cancelled before its time never runs; bad times are 400s. A start with
`timeout_secs` ends cancelled, with its child, if it has not ended that long after it began."""
import json
import time

from broker.sharding import actor_name
from harness import get_json, scrape, wait_until

JSON = {"Content-Type": "application/json"}


def post(url, body, headers=JSON):
    return get_json(url, method="POST", headers=headers, body=json.dumps(body).encode())


def run_of(base, run_id, query="?wait=30"):
    status, _, body = get_json(f"{base}/v1/runs/{run_id}{query}", headers=JSON)
    assert status == 200, body
    return body


def first_step_began(base, run_id) -> float:
    status, _, body = get_json(f"{base}/v1/runs/{run_id}/steps", headers=JSON)
    assert status == 200, body
    return body["steps"][0]["started_at"]


def test_delayed_runs_wait_for_their_time_and_runs_past_their_timeout_are_cancelled(make_server, make_worker,
                                                                                    tmp_path):
    server = make_server()
    make_worker(server)
    base = server.url
    files = {name: tmp_path / name for name in ("later", "at", "cancelled")}
    flow = f"{base}/v1/flows/sleeper/runs"

    # Timeouts, begun first: they run out while the delayed starts below wait.
    status, _, parent = post(f"{base}/v1/flows/parent_of_sleeper/runs",
                             {"input": {"child": "sleepy-child"}, "run_id": "sleepy", "timeout_secs": 2})
    assert status == 201 and parent["timeout_at"] == parent["started_at"] + 2
    status, _, late = post(f"{base}/v1/flows/sleeps_an_hour/runs", {"input": {}, "delay_secs": 2, "timeout_secs": 1.5})
    assert status == 201 and late["timeout_at"] == late["start_at"] + 1.5   # counted from its start
    for timeout in (0, -1, "5", 10 ** 9):
        status, _, error = post(f"{base}/v1/flows/sleeps_an_hour/runs", {"input": {}, "timeout_secs": timeout})
        assert status == 400 and error["error"]["code"] == "invalid_timeout", (timeout, error)

    status, _, later = post(flow, {"input": {"file": str(files["later"]), "secs": 0.1}, "delay_secs": 3},
                            {**JSON, "Idempotency-Key": "later-1"})
    assert status == 201 and later["status"] == "scheduled", later
    assert time.time() + 1 < later["start_at"] < time.time() + 3.5
    repeated = post(flow, {"input": {"file": str(files["later"]), "secs": 0.1}, "delay_secs": 3},
                    {**JSON, "Idempotency-Key": "later-1"})
    assert repeated[0] == 200 and repeated[2]["run_id"] == later["run_id"]
    assert repeated[2]["start_at"] == later["start_at"]          # the first start's time holds

    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))
    status, _, timed = post(flow, {"input": {"file": str(files["at"]), "secs": 0.1}, "start_at": at, "run_id": "at-1"})
    assert status == 201 and timed["status"] == "scheduled"
    status, _, doomed = post(flow, {"input": {"file": str(files["cancelled"]), "secs": 0.1}, "delay_secs": 3,
                                    "run_id": "cancelled-1"})
    assert status == 201
    assert post(f"{base}/v1/runs/cancelled-1:cancel", {})[2]["status"] == "cancelled"

    server.kill9(actor_name("at-1", 2))   # its timer is gone with it: the actor sets it again
    assert run_of(base, "at-1", "")["status"] == "scheduled"
    listed = {r["run_id"]: r for r in get_json(f"{base}/v1/runs?status=scheduled")[2]["runs"]}
    assert "at-1" in listed and listed["at-1"]["start_at"] == timed["start_at"], listed

    for run in (later, timed):
        done = run_of(base, run["run_id"])
        assert done["status"] == "completed", done
        assert first_step_began(base, run["run_id"]) >= run["start_at"]   # not before its time
    assert files["later"].read_text().split() == ["before", "after"]      # once
    assert files["at"].read_text().split() == ["before", "after"]
    time.sleep(max(0.0, doomed["start_at"] + 1.5 - time.time()))
    assert run_of(base, "cancelled-1", "")["status"] == "cancelled" and not files["cancelled"].exists()

    for body in ({"delay_secs": -1}, {"start_at": "soon"}, {"start_at": "2026-12-06T10:00:00"},
                 {"start_at": 1, "delay_secs": 1}, {"delay_secs": 10 ** 9}):
        status, _, error = post(flow, {"input": {}, **body})
        assert status == 400 and error["error"]["code"] == "invalid_start_at", (body, error)

    ended = run_of(base, "sleepy")
    assert ended["status"] == "cancelled" and "timed out" in ended["error"], ended
    assert ended["ended_at"] >= parent["timeout_at"]
    assert run_of(base, "sleepy-child")["status"] == "cancelled"            # with its child
    late = run_of(base, late["run_id"])
    assert late["status"] == "cancelled" and late["ended_at"] >= late["timeout_at"]

    # agentos_flow_*, flushed once a second (what the killed actor had not flushed is not in them:
    # these ends all came after the kill)
    ends = {'agentos_flow_runs_ended_total{flow="sleeps_an_hour",status="cancelled"}': 2,
            'agentos_flow_runs_ended_total{flow="parent_of_sleeper",status="cancelled"}': 1,
            'agentos_flow_runs_ended_total{flow="sleeper",status="completed"}': 2}
    got = wait_until(lambda: (lambda m: m if all(m.get(k) == v for k, v in ends.items()) else None)(scrape(base)),
                     10, f"the runs' ends to be counted: {ends}")
    assert got['agentos_flow_steps_total{outcome="completed"}'] >= 4
    assert got.get('agentos_flow_runs_started_total{flow="sleeper"}', 0) >= 1
