"""End-to-end: a flow's operations at once (asyncio.gather) on a real worker — steps side by
side, each recorded at its place whatever order they finished in, a retry among them; children
started together, their parent going on once, when the last has ended; a wait on several
channels woken by any of them; messages taken once per key, sent from one run to another, and
published to every run waiting on a channel."""
import json

from harness import get_json, wait_until
from test_e2e_flows import lines, result, start


def test_steps_run_at_once_under_asyncio_gather_each_recorded_at_its_place(flows_server, tmp_path):
    server = flows_server
    files = {"file": str(tmp_path / "first.txt"), "file2": str(tmp_path / "second.txt")}
    _, _, run = start(server.url, "fan_out", files)
    done = result(server.url, run["run_id"])
    assert done["status"] == "completed" and done["result"] == ["a", "b", "c", "d", "e"], done   # each met the others
    steps = get_json(f"{server.url}/v1/runs/{run['run_id']}/steps")[2]["steps"]
    assert [(s["seq"], s["op"], s["name"], s["status"], s.get("attempts")) for s in steps] == [
        (0, "step", "meet-a", "completed", 2), (1, "step", "meet-b", "completed", 1),
        (2, "step", "meet-c", "completed", 1), (3, "sleep", "sleep", "completed", None),
        (4, "step", "meet-d", "completed", 1), (5, "step", "meet-e", "completed", 1)], steps
    assert max(s["ended_at"] for s in steps[:3]) <= steps[3]["started_at"]   # the sleep parked with nothing in flight
    # a's first attempt failed (its retry kept its place), and no step ran again after the sleep
    assert sorted(lines(tmp_path / "first.txt")) == ["begin a", "begin a", "begin b", "begin c"]


def test_children_started_at_once_run_at_once_and_their_parent_goes_on_when_all_ended(flows_server, tmp_path):
    server = flows_server
    _, _, run = start(server.url, "fan_out_children", {"file": str(tmp_path / "met.txt")})
    done = result(server.url, run["run_id"])
    assert done["status"] == "completed" and done["result"] == ["a", "b", "c", "after"], done   # each met the others
    steps = get_json(f"{server.url}/v1/runs/{run['run_id']}/steps")[2]["steps"]
    assert [(s["seq"], s["op"], s["name"], s["status"]) for s in steps] == [
        (0, "child", "met", "completed"), (1, "child", "met", "completed"), (2, "child", "met", "completed"),
        (3, "step", "after", "completed")], steps
    assert len(lines(tmp_path / "met.txt.after")) == 1


def publish(base: str, run_id: str, channel: str, message) -> None:
    status, _, body = get_json(f"{base}/v1/runs/{run_id}/channels/{channel}", method="POST",
                               body=json.dumps({"message": message}).encode())
    assert status == 202, body


def test_a_wait_on_several_channels_is_woken_by_any_and_journals_which(flows_server, tmp_path):
    server = flows_server
    _, _, run = start(server.url, "chooser", {"file": str(tmp_path / "took.txt")})
    run_id = run["run_id"]
    wait_until(lambda: get_json(f"{server.url}/v1/runs/{run_id}")[2]["status"] == "suspended", 30, "the wait")
    waiting = get_json(f"{server.url}/v1/runs/{run_id}")[2]["waiting_on"]
    assert {k: waiting[k] for k in ("op", "seq", "channels")} == {"op": "wait", "seq": 0,
                                                                   "channels": ["approve", "reject"]}, waiting
    assert "due" not in waiting and waiting["since"] > 0
    publish(server.url, run_id, "reject", {"why": "too dear"})
    done = result(server.url, run_id)
    assert done["status"] == "completed" and done["result"] == [["reject", {"why": "too dear"}], "timed out"], done
    steps = get_json(f"{server.url}/v1/runs/{run_id}/steps")[2]["steps"]
    assert [(s["op"], s["name"], s["status"], s.get("channels")) for s in steps] == [
        ("wait", "approve|reject", "completed", ["approve", "reject"]), ("step", "took", "completed", None),
        ("wait", "approve|reject", "failed", ["approve", "reject"])], steps
    assert lines(tmp_path / "took.txt") == ["took reject"]   # the replay after the wait took the same path


def test_a_wait_on_several_channels_takes_the_first_published_of_those_waiting(flows_server, tmp_path):
    server = flows_server
    gate = tmp_path / "gate"
    _, _, run = start(server.url, "chooser", {"file": str(tmp_path / "took.txt"), "gate": str(gate)})
    for channel, message in (("reject", "r1"), ("approve", "a1"), ("reject", "r2")):
        publish(server.url, run["run_id"], channel, message)
    gate.touch()
    done = result(server.url, run["run_id"])
    assert done["status"] == "completed" and done["result"] == [["reject", "r1"], ["approve", "a1"]], done


def test_a_publish_sent_again_under_its_key_is_taken_once_even_after_the_run_ended(flows_server):
    server = flows_server
    _, _, run = start(server.url, "waiter", {})   # two waits on "inbox"
    run_id = run["run_id"]
    for message, key in (("first", "k1"), ("first", "k1"), ("second", "k2")):   # the second "first": a retry
        status, _, body = get_json(f"{server.url}/v1/runs/{run_id}/channels/inbox", method="POST",
                                   body=json.dumps({"message": message}).encode(), headers={"Idempotency-Key": key})
        assert status == 202, body
    done = result(server.url, run_id)
    assert done["status"] == "completed" and done["result"] == ["first", "second"], done
    again = get_json(f"{server.url}/v1/runs/{run_id}/channels/inbox", method="POST", body=b'{"message": "first"}',
                     headers={"Idempotency-Key": "k1"})
    assert again[0] == 202   # as it was answered the first time
    assert get_json(f"{server.url}/v1/runs/{run_id}/channels/inbox", method="POST", body=b'{"message": 3}',
                    headers={"Idempotency-Key": "k3"})[0] == 409


def test_a_flow_sends_to_another_runs_channel_and_hears_of_a_run_that_is_not_there(flows_server):
    server = flows_server
    _, _, target = start(server.url, "waiter", {})
    _, _, sender = start(server.url, "sender", {"to": target["run_id"]})
    assert result(server.url, target["run_id"])["result"] == ["hello", "again"]
    done = result(server.url, sender["run_id"])
    assert done["status"] == "completed" and "not_found" in done["result"], done
    steps = get_json(f"{server.url}/v1/runs/{sender['run_id']}/steps")[2]["steps"]
    assert [(s["op"], s["name"], s["status"]) for s in steps] == [
        ("send", f"inbox@{target['run_id']}", "completed"), ("send", f"inbox@{target['run_id']}", "completed"),
        ("send", "inbox@no-such-run", "failed")], steps


def broadcast(base: str, channel: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    status, _, answer = get_json(f"{base}/v1/channels/{channel}", method="POST", body=json.dumps(body).encode(),
                                 headers={"Idempotency-Key": key} if key else {})
    return status, answer


def test_a_publish_to_a_channel_reaches_each_run_waiting_on_it_and_chosen_by_its_attributes(flows_server):
    """By HTTP (POST /v1/channels/{name}) and from a flow (ctx.publish)."""
    server = flows_server
    runs = [start(server.url, "subscriber", {"invoice": invoice, "until": "last"})[2]["run_id"]
            for invoice in ("inv-1", "inv-1", "inv-2")]
    for run_id in runs:   # (the runs' ids hash to both actors)
        assert get_json(f"{server.url}/v1/runs/{run_id}?wait=30&until=suspended")[2]["status"] == "suspended"
    waiting = get_json(f"{server.url}/v1/channels/paid?flow=subscriber&limit=2")[2]
    listed = waiting["runs"]   # the two waiting longest, those first
    assert waiting["count"] == 3 and len(listed) == 2 and {r["run_id"] for r in listed} < set(runs), waiting
    assert listed[0]["since"] <= listed[1]["since"] and listed[0]["flow"] == "subscriber"
    assert broadcast(server.url, "paid", {"message": "inv-1 paid", "where": {"invoice": "inv-1"}}, "p1") == (
        200, {"channel": "paid", "delivered": 2})
    for run_id in runs[:2]:   # taken: each runs on to its next wait
        wait_until(lambda: get_json(f"{server.url}/v1/runs/{run_id}")[2].get("waiting_on", {}).get("seq") == 2,
                   30, "the next wait")
    # sent again under its key (an answer lost): the runs that took it, waiting again, do not take it twice
    assert broadcast(server.url, "paid", {"message": "inv-1 paid", "where": {"invoice": "inv-1"}}, "p1")[1] == {
        "channel": "paid", "delivered": 0}
    assert broadcast(server.url, "nobody-waits", {"message": 1})[1]["delivered"] == 0
    assert get_json(f"{server.url}/v1/channels/paid")[2]["count"] == 3   # the first two wait again
    _, _, announcer = start(server.url, "announcer", {"message": "from a flow", "where": {"invoice": "inv-2"}})
    assert result(server.url, announcer["run_id"])["result"] == 1   # a flow's publish (ctx.publish)
    wait_until(lambda: get_json(f"{server.url}/v1/channels/paid")[2]["count"] == 3, 30, "the third waits again")
    assert broadcast(server.url, "paid", {"message": "last", "flow": "subscriber"})[1]["delivered"] == 3
    assert [result(server.url, run_id)["result"] for run_id in runs] == [
        ["inv-1 paid", "last"], ["inv-1 paid", "last"], ["from a flow", "last"]]
    for bad in ({"message": 1, "where": []}, {"message": 1, "where": {}}, {"message": 1, "flows": "x"},
                {"message": 1, "flow": "no/such"}):
        status, answer = broadcast(server.url, "paid", bad)
        assert status == 400 and answer["error"]["code"] in ("invalid_where", "invalid_body", "invalid_flow"), bad
