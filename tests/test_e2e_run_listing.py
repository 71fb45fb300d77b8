"""End-to-end: GET /v1/runs lists a tenant's flow runs — its own only, not the agent turns' —
with their flow and state, a page at a time, of one flow or one state, and a run's end shows in
the next listing."""
import json

from harness import get_json, turn

ACME = {"Authorization": "Bearer key-acme", "Content-Type": "application/json"}
GLOBEX = {"Authorization": "Bearer key-globex", "Content-Type": "application/json"}


def start(base, flow, input, headers, run_id=None):
    status, _, body = get_json(f"{base}/v1/flows/{flow}/runs", method="POST", headers=headers,
                               body=json.dumps({"input": input, **({"run_id": run_id} if run_id else {})}).encode())
    assert status == 201, body
    return body["run_id"]


def ended(base, run_id, headers):
    return get_json(f"{base}/v1/runs/{run_id}?wait=30", headers=headers)[2]["status"]


def listing(base, headers, query="", cursor="after"):
    """Every page, followed to the end (`cursor` "before": with order=desc)."""
    runs, after = [], None
    for _ in range(50):
        status, _, body = get_json(f"{base}/v1/runs?{query}{f'&{cursor}=' + after if after else ''}", headers=headers)
        assert status == 200, body
        runs += body["runs"]
        after = body[f"next_{cursor}"]
        if after is None:
            return runs
    raise AssertionError("the listing did not end")


def test_a_tenant_lists_its_runs_by_state_and_flow_a_page_at_a_time(make_server, make_worker):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    make_worker(server)
    base = server.url
    start(base, "async_steps", 3, ACME, "steps-1")
    start(base, "failing", {}, ACME, "fails-1")
    start(base, "parent", 3, ACME, "parent-1")
    start(base, "waiter", {}, ACME, "waits-1")
    start(base, "async_steps", 1, GLOBEX, "theirs-1")
    assert ended(base, "steps-1", ACME) == "completed" and ended(base, "fails-1", ACME) == "failed"
    assert ended(base, "parent-1", ACME) == "completed" and ended(base, "theirs-1", GLOBEX) == "completed"
    assert turn(base, "s1", "hi", headers=ACME).terminal == "turn.completed"   # a turn is no flow run

    runs = {r["run_id"]: r for r in listing(base, ACME)}
    assert set(runs) == {"steps-1", "fails-1", "parent-1", "parent-1.0", "parent-1.1", "waits-1"}
    assert {r["run_id"]: r["status"] for r in runs.values()} == {
        "steps-1": "completed", "fails-1": "failed", "parent-1": "completed", "parent-1.0": "completed",
        "parent-1.1": "completed", "waits-1": "running"}
    assert runs["parent-1.0"]["parent"] == "parent-1" and runs["steps-1"]["flow"] == "async_steps"
    assert runs["steps-1"]["started_at"] <= runs["steps-1"]["ended_at"] and runs["waits-1"]["ended_at"] is None
    for run_id, row in runs.items():   # a run read alone says what the listing says of it
        one = get_json(f"{base}/v1/runs/{run_id}", headers=ACME)[2]
        # (its actor knows it waits for a message: the listing, from the journal, says running)
        one["status"] = "running" if one["status"] == "suspended" else one["status"]
        assert {k: one.get(k) for k in ("flow", "status", "started_at", "ended_at", "parent")} == \
            {k: row.get(k) for k in ("flow", "status", "started_at", "ended_at", "parent")}, (one, row)
    assert [r["run_id"] for r in listing(base, ACME, "limit=1")] == sorted(runs)   # one a page, in id order
    assert [r["run_id"] for r in listing(base, ACME, "status=failed")] == ["fails-1"]
    assert [r["run_id"] for r in listing(base, ACME, "flow=child&limit=1")] == ["parent-1.0", "parent-1.1"]
    assert [r["run_id"] for r in listing(base, ACME, "status=open")] == ["waits-1"]
    assert [r["run_id"] for r in listing(base, GLOBEX)] == ["theirs-1"]

    assert get_json(f"{base}/v1/runs/waits-1:cancel", method="POST", headers=ACME)[2]["status"] == "cancelled"
    assert [r["run_id"] for r in listing(base, ACME, "status=cancelled")] == ["waits-1"]   # read after its end
    assert listing(base, ACME, "status=open") == []

    # ids the server makes sort in the order their runs began: a listing shows them so
    made = [start(base, "waiter", {}, ACME) for _ in range(6)]   # (random ids: in this order 1 time in 720)
    assert [r["run_id"] for r in listing(base, ACME, "flow=waiter&status=open")] == made
    # …and newest first with order=desc, a page at a time down to the first run
    assert [r["run_id"] for r in listing(base, ACME, "order=desc&flow=waiter&status=open&limit=4", "before")] == \
        made[::-1]
    # …or those started in a window of time
    began = [r["started_at"] for r in listing(base, ACME, "flow=waiter&status=open")]
    assert [r["run_id"] for r in listing(base, ACME, f"flow=waiter&started_after={began[2]!r}"
                                                     f"&started_before={began[4]!r}")] == made[2:4]
    newest_first = listing(base, ACME, "order=desc&limit=2", "before")
    assert newest_first == listing(base, ACME)[::-1] and len(newest_first) == 12

    for bad in ("status=suspended", "flow=bad%20name", "limit=0", "after=a%2Fb", "limit=x", "order=newest",
                "order=desc&after=steps-1", "before=steps-1", "order=desc&before=a%2Fb", "started_after=yesterday",
                "started_before=inf"):
        status, _, body = get_json(f"{base}/v1/runs?{bad}", headers=ACME)
        assert status == 400 and body["error"]["code"] == "invalid_parameter", (bad, body)
    assert get_json(f"{base}/v1/runs")[0] == 401
