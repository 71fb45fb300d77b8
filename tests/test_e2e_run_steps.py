"""End-to-end: GET /v1/runs/{id}/steps shows a run's operations in order — each step with its
state, attempts, times and outcome (an error kept), a wait with its channel until a message
wakes it, children by id, a page at a time — for the tenant's own runs only."""
import json
import time

from harness import get_json

ACME = {"Authorization": "Bearer key-acme", "Content-Type": "application/json"}
GLOBEX = {"Authorization": "Bearer key-globex", "Content-Type": "application/json"}


def start(base, flow, input, run_id, headers=ACME):
    status, _, body = get_json(f"{base}/v1/flows/{flow}/runs", method="POST", headers=headers,
                               body=json.dumps({"input": input, "run_id": run_id}).encode())
    assert status == 201, body


def ended(base, run_id):
    return get_json(f"{base}/v1/runs/{run_id}?wait=30", headers=ACME)[2]["status"]


def steps(base, run_id, query="", headers=ACME):
    status, _, body = get_json(f"{base}/v1/runs/{run_id}/steps{query}", headers=headers)
    assert status == 200, body
    assert body["run_id"] == run_id
    return body


def test_a_runs_steps_show_their_state_attempts_times_and_outcome(make_server, make_worker, tmp_path):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    make_worker(server)
    base = server.url
    start(base, "flaky", {"file": str(tmp_path / "flaky")}, "flaky-1")      # fails once, then succeeds
    start(base, "failing", {}, "fails-1")                                    # fails both attempts
    start(base, "parent", 3, "parent-1")                                     # two children
    start(base, "five_steps", {"file": str(tmp_path / "five"), "delay": 0}, "five-1")
    start(base, "bytes_step", {}, "bytes-1")
    for run_id, status in (("flaky-1", "completed"), ("fails-1", "failed"), ("parent-1", "completed"),
                           ("five-1", "completed"), ("bytes-1", "completed")):
        assert ended(base, run_id) == status, run_id

    (flaky,) = steps(base, "flaky-1")["steps"]
    assert {k: flaky[k] for k in ("seq", "op", "name", "status", "attempts", "result")} == {
        "seq": 0, "op": "step", "name": "fail_first", "status": "completed", "attempts": 2, "result": 2}
    assert 0 < flaky["started_at"] <= flaky["ended_at"]
    (failed,) = steps(base, "fails-1")["steps"]
    assert failed["status"] == "failed" and failed["attempts"] == 2 and "boom" in failed["error"]
    assert "result" not in failed

    children = steps(base, "parent-1")["steps"]
    assert [(c["op"], c["status"], c["child"], c["result"]) for c in children] == [
        ("child", "completed", "parent-1.0", 6), ("child", "completed", "parent-1.1", 8)]
    assert steps(base, "parent-1.1")["steps"][0]["result"] == 8     # a child's own steps

    pages, after = [], None
    for _ in range(10):   # one page of two at a time, to the end
        body = steps(base, "five-1", f"?limit=2{f'&after={after}' if after is not None else ''}")
        pages.append([s["name"] for s in body["steps"]])
        after = body["next_after"]
        if after is None:
            break
    assert pages == [["step-0", "step-1"], ["step-2", "step-3"], ["step-4"]]
    assert [s["result"] for s in steps(base, "five-1", "?after=2")["steps"]] == [30, 40]

    (raw,) = steps(base, "bytes-1")["steps"]   # bytes are no JSON: named with their size, not a 500
    assert raw["status"] == "completed" and raw["result"] == {"unreadable": "bytes", "msgpack_bytes": 4}

    assert get_json(f"{base}/v1/runs/nobody/steps", headers=ACME)[0] == 404
    assert get_json(f"{base}/v1/runs/flaky-1/steps", headers=GLOBEX)[0] == 404   # another tenant's
    for bad in ("after=x", "after=-2", "limit=0", "limit=1001"):
        status, _, body = get_json(f"{base}/v1/runs/flaky-1/steps?{bad}", headers=ACME)
        assert status == 400 and body["error"]["code"] == "invalid_parameter", (bad, body)
    assert get_json(f"{base}/v1/runs/flaky-1/steps")[0] == 401


def test_a_wait_shows_its_channel_until_a_message_wakes_it_and_a_cancel_abandons_it(make_server, make_worker):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme"}}})
    make_worker(server)
    base = server.url
    start(base, "waiter", {}, "waits-1")
    assert get_json(f"{base}/v1/runs/waits-1?wait=30&until=suspended", headers=ACME)[2]["status"] == "suspended"
    (first,) = steps(base, "waits-1")["steps"]
    assert (first["op"], first["status"], first["channel"], first["ended_at"]) == ("wait", "waiting", "inbox", None)

    assert get_json(f"{base}/v1/runs/waits-1/channels/inbox", method="POST", headers=ACME,
                    body=b'{"message": {"n": 1}}')[0] == 202
    for _ in range(300):   # until the run waits again, for its second message (bounded: 30 s)
        got = steps(base, "waits-1")["steps"]
        if len(got) == 2 and got[0]["status"] == "completed":
            break
        time.sleep(0.1)
    assert [(s["status"], s.get("result")) for s in got] == [("completed", {"n": 1}), ("waiting", None)]

    assert get_json(f"{base}/v1/runs/waits-1:cancel", method="POST", headers=ACME)[2]["status"] == "cancelled"
    assert [s["status"] for s in steps(base, "waits-1")["steps"]] == ["completed", "abandoned"]
