"""End-to-end: POST /v1/runs/{id}:fork starts a new run of a run's flow and input that replays
its operations before `from_seq` (their results the original's: no step runs again, no child is
started again) and runs on from there — by default from the first that did not succeed, so a
run that failed on a bug since fixed finishes; its attributes and untaken messages come along;
the fork is a run of its own (listed, read back after its actor's kill -9, forked in turn), for its
tenant only."""
import json
from pathlib import Path

from broker.sharding import actor_name
from harness import get_json

ACME = {"Authorization": "Bearer key-acme", "Content-Type": "application/json"}
GLOBEX = {"Authorization": "Bearer key-globex", "Content-Type": "application/json"}


def post(url, body=None, headers=ACME):
    return get_json(url, method="POST", headers=headers, body=None if body is None else json.dumps(body).encode())


def run_of(base, run_id, query="?wait=30"):
    status, _, body = get_json(f"{base}/v1/runs/{run_id}{query}", headers=ACME)
    assert status == 200, body
    return body


def steps(base, run_id):
    status, _, body = get_json(f"{base}/v1/runs/{run_id}/steps", headers=ACME)
    assert status == 200, body
    return body["steps"]


def fork(base, source, body=None, status=201, headers=ACME):
    got, _, run = post(f"{base}/v1/runs/{source}:fork", body, headers)
    assert got == status, run
    return run


def test_a_fork_replays_what_came_before_and_runs_on_from_the_step_that_failed(make_server, make_worker, tmp_path):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    make_worker(server)
    base = server.url
    effects, marker = tmp_path / "effects", tmp_path / "fixed"
    args = {"file": str(effects), "marker": str(marker)}
    assert post(f"{base}/v1/flows/forkable/runs", {"input": args, "run_id": "src-1"})[0] == 201
    assert run_of(base, "src-1", "?wait=30&until=suspended")["status"] == "suspended"
    assert post(f"{base}/v1/runs/src-1/channels/approve", {"message": "yes"})[0] == 202
    source = run_of(base, "src-1")
    assert source["status"] == "failed" and "marker" in source["error"]
    original = steps(base, "src-1")
    assert [(s["op"], s["status"]) for s in original] == [
        ("step", "completed"), ("attr_set", "completed"), ("child", "completed"), ("wait", "completed"),
        ("step", "failed")]

    marker.touch()   # the fix is deployed
    first = fork(base, "src-1")   # from the first operation that did not succeed: the failed step
    assert first["forked_from"] == "src-1" and first["fork_seq"] == 4 and first["run_id"].startswith("r")
    done = run_of(base, first["run_id"])
    assert done["status"] == "completed", done
    assert done["result"] == {"a": 1, "child": 2, "message": "yes", "b": "fixed"}
    assert effects.read_text().split() == ["a"]   # step a ran once, for both
    forked = steps(base, first["run_id"])
    assert forked[:4] == original[:4]             # replayed as recorded: results, attempts, times
    assert forked[4]["status"] == "completed" and forked[4]["attempts"] == 1 and forked[4]["result"] == "fixed"
    assert get_json(f"{base}/v1/runs/{first['run_id']}/attributes", headers=ACME)[2]["attributes"] == {
        "stage": "waiting"}
    assert get_json(f"{base}/v1/runs/{first['run_id']}.2", headers=ACME)[0] == 404   # no second child

    # From the wait, by key: the message the original's wait took is there for the fork's.
    keyed = {**ACME, "Idempotency-Key": "retry-1"}
    second = fork(base, "src-1", {"from_seq": 3}, headers=keyed)
    assert fork(base, "src-1", {"from_seq": 3}, status=200, headers=keyed)["run_id"] == second["run_id"]
    assert post(f"{base}/v1/runs/src-1:fork", {"from_seq": 0}, keyed)[0] == 409   # the key named another fork
    assert run_of(base, second["run_id"])["result"] == {"a": 1, "child": 2, "message": "yes", "b": "fixed"}
    assert [s["status"] for s in steps(base, second["run_id"])] == ["completed"] * 5

    # From the start, with a chosen id: everything runs again, a new child included.
    again = fork(base, "src-1", {"from_seq": 0, "run_id": "again-1"})
    assert again["run_id"] == "again-1" and again["fork_seq"] == 0
    assert run_of(base, "again-1")["result"] == {"a": 2, "child": 2, "message": "yes", "b": "fixed"}
    assert run_of(base, "again-1.2")["status"] == "completed"
    assert effects.read_text().split() == ["a", "a"]

    # A fork is a run like any: listed, and read back from its journal after its actor's kill -9.
    listed = get_json(f"{base}/v1/runs?flow=forkable", headers=ACME)[2]["runs"]
    assert {r["run_id"] for r in listed} == {"src-1", first["run_id"], second["run_id"], "again-1"}
    server.kill9(actor_name(f"acme~{first['run_id']}", 2))
    assert steps(base, first["run_id"]) == forked
    assert run_of(base, first["run_id"], "")["forked_from"] == "src-1"

    # A fork's own fork: from where the first began, or later; from earlier, the original's.
    third = fork(base, first["run_id"])   # every operation succeeded: it replays them all
    assert third["forked_from"] == first["run_id"] and third["fork_seq"] == 5
    assert run_of(base, third["run_id"])["result"] == done["result"]
    status, _, body = post(f"{base}/v1/runs/{first['run_id']}:fork", {"from_seq": 2})
    assert status == 409 and "fork the run it was forked from" in body["error"]["message"]

    # Refusals: past the operations with an outcome, bad bodies, another tenant's run, none.
    status, _, body = post(f"{base}/v1/runs/src-1:fork", {"from_seq": 6})
    assert status == 409 and body["error"]["code"] == "not_forkable" and "at most 5" in body["error"]["message"]
    for bad in ({"from_seq": -1}, {"from_seq": "3"}, {"from_seq": 1.5}, {"from": 3}, {"run_id": "a/b"}):
        status, _, body = post(f"{base}/v1/runs/src-1:fork", bad)
        assert status == 400, (bad, body)
    assert post(f"{base}/v1/runs/src-1:fork", {}, GLOBEX)[0] == 404
    assert post(f"{base}/v1/runs/nobody:fork", {})[0] == 404
    assert post(f"{base}/v1/runs/src-1:fork", {}, {})[0] == 401
    assert Path(effects).read_text().split() == ["a", "a"]   # nothing refused ran anything
