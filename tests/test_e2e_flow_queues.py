"""End-to-end: flow queues (`kernel.flow_queues`) on the real process set — a queue's runs wait
`enqueued` and run at most its limit at once, also through a kill -9 of an actor holding some of
them and of the scheduler; a queue's rate spaces its admissions; lower priority numbers go
first; a queue per key keeps its limit for each key; a rate's window holds through a restart of
the scheduler with every actor; an enqueued run can be cancelled and never runs; a run or a
schedule naming no such queue is a 400."""
import json
import os
import signal
import time

from broker.sharding import actor_name
from harness import get_json, scrape, wait_until


def start(base, input, queue="two", **fields):
    return get_json(f"{base}/v1/flows/queued/runs", method="POST",
                    body=json.dumps({"input": input, "queue": queue, **fields}).encode(),
                    headers={"Content-Type": "application/json"})


def most_at_once(path) -> int:
    running, most = set(), 0
    for line in path.read_text().splitlines():
        sign, run_id = line.split()
        (running.add if sign == "+" else running.discard)(run_id)
        most = max(most, len(running))
    return most


def test_a_queue_runs_at_most_its_limit_at_once_through_an_actors_kill(make_server, make_worker, tmp_path):
    server = make_server({"kernel": {"flow_queues": "two=2, one=1, rated=*@2/1s, per_user=1 per key, slow=*@2/10s"}})
    make_worker(server)
    base, log = server.url, tmp_path / "occupied.txt"
    status, _, body = start(base, {"file": str(log)}, queue="three")
    assert (status, body["error"]["code"]) == (400, "unknown_queue") and "one, per_user, rated, slow, two" in body["error"]["message"]
    assert start(base, {"file": str(log)}, queue=["two"])[2]["error"]["code"] == "unknown_queue"
    # a schedule's runs may wait in a queue too (one place: they never overlap)
    yearly = {"flow": "queued", "cron": "0 0 1 1 *", "input": {"file": str(log)}}
    status, _, body = get_json(f"{base}/v1/schedules/yearly", method="PUT",
                               body=json.dumps({**yearly, "queue": "three"}).encode())
    assert (status, body["error"]["code"]) == (400, "unknown_queue")
    status, _, body = get_json(f"{base}/v1/schedules/yearly", method="PUT", body=json.dumps({**yearly, "queue": "one"}).encode())
    assert status == 201 and body["queue"] == "one"

    runs = []
    for i in range(8):
        status, _, body = start(base, {"file": str(log), "secs": 0.8}, run_id=f"q-{i}")
        assert status == 201 and body["queue"] == "two", body
        runs.append(body["run_id"])
    assert body["status"] == "enqueued"   # the 8th: two places, and none given yet
    status, _, listed = get_json(f"{base}/v1/queues")
    assert status == 200 and [q["name"] for q in listed["queues"]] == ["two", "one", "rated", "per_user", "slow"]
    two = listed["queues"][0]
    assert two["limit"] == 2 and two["running"] <= 2 and two["waiting"] >= 1   # the 8th at least waits
    assert two["own"] == {"running": two["running"], "waiting": two["waiting"]}   # one tenant: all its own
    status, _, cancelled = get_json(f"{base}/v1/runs/q-7:cancel", method="POST")
    assert (status, cancelled["status"]) == (200, "cancelled")

    wait_until(lambda: log.exists() and log.read_text().count("+") >= 2, 30, "the first two to run")
    # the actor of some of them, killed while they run or wait: admissions are in their journals;
    # then the scheduler, which holds the places: a new one grants nothing until the actors said
    # what they hold
    server.kill9(actor_name("q-0", 2))
    wait_until(lambda: log.read_text().count("-") >= 1, 30, "a run to end")
    server.kill9("scheduler")
    for run_id in runs[:7]:
        wait_until(lambda: get_json(f"{base}/v1/runs/{run_id}?wait=10")[2].get("status") == "completed", 60,
                   f"{run_id} to complete")
    assert get_json(f"{base}/v1/runs/q-6")[2]["queue"] == "two"
    assert most_at_once(log) == 2, log.read_text()
    assert "q-7" not in log.read_text()   # cancelled while it waited: never ran
    wait_until(lambda: scrape(base).get('agentos_flow_queue_running{queue="two"}') == 0, 10, "the places back")
    assert scrape(base).get('agentos_flow_queue_waiting{queue="two"}') == 0
    assert get_json(f"{base}/v1/queues")[2]["queues"][0] == {"name": "two", "limit": 2, "running": 0, "waiting": 0,
                                                             "rate": None, "per": None,
                                                             "own": {"running": 0, "waiting": 0}}

    # a rate: two admitted in any second, however many places are free
    for i in range(6):
        assert start(base, {"file": str(log), "secs": 0.05}, queue="rated", run_id=f"rated-{i}")[0] == 201
    rated = get_json(f"{base}/v1/queues")[2]["queues"][2]
    assert rated["limit"] is None and rated["rate"]["starts"] == 2 and rated["rate"]["per_secs"] == 1.0
    admitted = []
    for i in range(6):
        done = get_json(f"{base}/v1/runs/rated-{i}?wait=30")[2]
        assert done["status"] == "completed", done
        admitted.append(done["admitted_at"])
    admitted.sort()
    # (the scheduler spaces its grants by 1 s; each actor journals its admission a little later)
    assert all(later - earlier > 0.7 for earlier, later in zip(admitted, admitted[2:])), admitted

    # a queued run's timeout counts from its admission: behind a 2 s run in a queue of one, a
    # 1.5 s timeout does not cancel the second before it got to run
    start(base, {"file": str(log), "secs": 2.0}, queue="one", run_id="long")
    began = time.time()
    status, _, second = start(base, {"file": str(log), "secs": 0.1}, queue="one", run_id="short", timeout_secs=1.5)
    assert status == 201 and second["status"] == "enqueued" and "timeout_at" not in second
    done = get_json(f"{base}/v1/runs/short?wait=30")[2]
    assert done["status"] == "completed" and done["timeout_at"] > began + 1.5, done

    # a flow's child in a queue (ctx.child(..., queue=)) waits there like any run
    start(base, {"file": str(log), "secs": 3.0}, queue="one", run_id="long-2")
    status, _, parent = get_json(f"{base}/v1/flows/parent_in_queue/runs", method="POST", body=json.dumps(
        {"input": {"file": str(log), "secs": 0.1, "queue": "one", "child": "queued-child", "priority": 4}}).encode())
    assert status == 201
    wait_until(lambda: get_json(f"{base}/v1/runs/queued-child")[2].get("status") == "enqueued"
               and get_json(f"{base}/v1/runs/long-2")[2].get("status") == "running", 20,
               "the child to wait in its queue behind a run")
    # the listing tells the two apart as the runs' own views do (while long-2 has its 3 s)
    listed = {r["run_id"]: r["status"] for r in get_json(f"{base}/v1/runs?queue=one&status=open")[2]["runs"]}
    assert listed == {"long-2": "running", "queued-child": "enqueued"}, listed
    (waiting,) = get_json(f"{base}/v1/runs?status=enqueued")[2]["runs"]
    assert waiting["run_id"] == "queued-child" and waiting["priority"] == 4, waiting
    done = get_json(f"{base}/v1/runs/{parent['run_id']}?wait=30")[2]
    assert done["status"] == "completed" and done["result"] == "queued-child", done
    child = get_json(f"{base}/v1/runs/queued-child")[2]
    assert child["queue"] == "one" and child["priority"] == 4

    # a fork waits in its original's queue, or in the one it names
    def fork(source, body):
        return get_json(f"{base}/v1/runs/{source}:fork", method="POST", body=json.dumps(body).encode())

    status, _, same = fork("short", {"run_id": "short-fork"})
    assert status == 201 and same["queue"] == "one", same
    status, _, other = fork("short", {"queue": "two", "run_id": "short-fork-2"})
    assert status == 201 and other["queue"] == "two", other
    for bad in ("nope", 2):
        assert fork("short", {"queue": bad})[2]["error"]["code"] == "unknown_queue"
    for run_id in ("short-fork", "short-fork-2"):
        done = get_json(f"{base}/v1/runs/{run_id}?wait=30")[2]
        assert done["status"] == "completed" and done["admitted_at"] >= done["started_at"], done
    listed = {r["run_id"]: r for r in get_json(f"{base}/v1/runs?flow=queued&limit=1000")[2]["runs"]}
    assert listed["short-fork"]["forked_from"] == "short" and listed["short-fork"]["queue"] == "one"
    assert listed["short-fork-2"]["queue"] == "two" and listed["rated-0"]["queue"] == "rated"
    rated = get_json(f"{base}/v1/runs?queue=rated")[2]["runs"]
    assert sorted(r["run_id"] for r in rated) == [f"rated-{i}" for i in range(6)]
    assert get_json(f"{base}/v1/runs?queue=no%20such")[0] == 400

    # priorities: lower numbers first, whatever the order they came in
    for bad in ({"priority": -1}, {"priority": "high"}, {"priority": 2 ** 31}):
        assert start(base, {"file": str(log)}, queue="one", **bad)[2]["error"]["code"] == "invalid_priority"
    status, _, body = get_json(f"{base}/v1/flows/queued/runs", method="POST",
                               body=json.dumps({"input": {"file": str(log)}, "priority": 1}).encode())
    assert (status, body["error"]["code"]) == (400, "invalid_priority")   # a priority without a queue
    start(base, {"file": str(log), "secs": 1.5}, queue="one", run_id="blocker")
    for run_id, priority in (("p-low", 9), ("p-high", 1), ("p-none", 0)):
        status, _, body = start(base, {"file": str(log), "secs": 0.05}, queue="one", run_id=run_id, priority=priority)
        assert status == 201 and body["status"] == "enqueued" and body.get("priority", 0) == priority, body
    admitted = {run_id: get_json(f"{base}/v1/runs/{run_id}?wait=30")[2]["admitted_at"]
                for run_id in ("p-low", "p-high", "p-none")}
    assert sorted(admitted, key=admitted.get) == ["p-none", "p-high", "p-low"], admitted

    # a queue per key: one run of each user at a time, the users side by side
    assert start(base, {"file": str(log)}, queue="per_user")[2]["error"]["code"] == "invalid_queue_key"
    assert start(base, {"file": str(log)}, queue="one", queue_key="alice")[2]["error"]["code"] == "invalid_queue_key"
    for run_id, key, secs in (("alice-1", "alice", 1.2), ("alice-2", "alice", 0.05), ("bob-1", "bob", 0.05)):
        status, _, body = start(base, {"file": str(log), "secs": secs}, queue="per_user", run_id=run_id, queue_key=key)
        assert status == 201 and body["queue_key"] == key, body
    per_user = get_json(f"{base}/v1/queues")[2]["queues"][3]
    assert per_user["per"] == "key" and per_user["limit"] == 1
    done = {run_id: get_json(f"{base}/v1/runs/{run_id}?wait=30")[2] for run_id in ("alice-1", "alice-2", "bob-1")}
    assert all(run["status"] == "completed" for run in done.values()), done
    first = done["alice-1"]["admitted_at"]
    assert done["alice-2"]["admitted_at"] - first > 1.0   # after alice's first had its 1.2 s
    assert done["bob-1"]["admitted_at"] - first < 1.0     # bob's did not wait for alice's
    assert [r["run_id"] for r in get_json(f"{base}/v1/runs?queue=per_user&queue_key=alice")[2]["runs"]] == \
        ["alice-1", "alice-2"]
    assert get_json(f"{base}/v1/runs?queue_key=" + "k" * 201)[0] == 400
    shown = server.cli("status")
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("flow queues: ")]
    assert "two 0/2 running, 0 waiting" in line and "rated 0/* running" in line and "per_user 0 running, 0 waiting, over 0 keys (1 at once each)" in line

    # a rate's window holds through a restart of the scheduler together with every actor: the
    # actors read their admissions back from the journal, ended runs' too (the new scheduler has
    # nowhere else to learn of them)
    for i in range(2):
        assert start(base, {"file": str(log), "secs": 0.01}, queue="slow", run_id=f"slow-{i}")[0] == 201
    firsts = [get_json(f"{base}/v1/runs/slow-{i}?wait=30")[2] for i in range(2)]
    assert all(run["status"] == "completed" for run in firsts), firsts
    server.remember_pids()
    old = {name: server.pid(name) for name in ("scheduler", "actor/0", "actor/1")}
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)
    for name, pid in old.items():
        wait_until(lambda: (server.pid(name) or pid) != pid, 20, f"{name} to be restarted")
    server.remember_pids()
    assert start(base, {"file": str(log), "secs": 0.01}, queue="slow", run_id="slow-2")[0] == 201
    third = get_json(f"{base}/v1/runs/slow-2?wait=30")[2]
    assert third["status"] == "completed", third
    # (without them, the new scheduler gave its place out once the actors' first syncs came: 3-5 s)
    assert third["admitted_at"] - min(run["admitted_at"] for run in firsts) > 9.0, (firsts, third)
