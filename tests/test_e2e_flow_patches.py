"""End-to-end: a flow's code changes while a run of it waits. The run begun under the old code
(tests/flows_app.py) goes on under the new (tests/flows_app_v2.py, which asks `ctx.patched`) as it
was recorded, its step not run again; a run begun under the new code records the patch's mark and
takes the new path."""
import json

from harness import Worker, get_json


def start(base, run_id, marks):
    status, _, body = get_json(f"{base}/v1/flows/versioned/runs", method="POST",
                               body=json.dumps({"input": {"file": str(marks)}, "run_id": run_id}).encode())
    assert status == 201, body
    assert get_json(f"{base}/v1/runs/{run_id}?wait=30&until=suspended")[2]["status"] == "suspended"


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def test_a_run_begun_before_a_change_of_its_flow_goes_on_as_it_was_recorded(make_server, tmp_path):
    server = make_server()
    base = server.url
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    old = Worker(server)
    try:
        old.wait_registered()
        start(base, "before", before)   # took its first step and waits on its channel
    finally:
        old.stop()
    new = Worker(server, module="flows_app_v2")
    try:
        new.wait_registered()
        start(base, "after", after)
        ended = {}
        for run_id in ("before", "after"):
            status, _, _ = get_json(f"{base}/v1/runs/{run_id}/channels/go", method="POST",
                                    body=json.dumps({"message": f"go {run_id}"}).encode())
            assert status == 202   # taken: the run is woken
            ended[run_id] = get_json(f"{base}/v1/runs/{run_id}?wait=30")[2]
        assert ended["before"]["status"] == "completed", ended
        assert ended["before"]["result"] == {"first": "old", "message": "go before"}
        assert lines(before) == ["old step"]   # replayed, not run again
        assert ended["after"]["status"] == "completed", ended
        assert ended["after"]["result"] == {"first": "new", "message": "go after"}
        assert lines(after) == ["new step"]
        ops = {run_id: [(s["op"], s["name"]) for s in get_json(f"{base}/v1/runs/{run_id}/steps")[2]["steps"]]
               for run_id in ended}
        assert ops["before"][:1] == [("step", "old_step")] and ("patch", "new-first-step") not in ops["before"]
        assert ops["after"][:2] == [("patch", "new-first-step"), ("step", "new_step")]
    finally:
        new.stop()
