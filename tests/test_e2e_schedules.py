"""End-to-end: a schedule (PUT /v1/schedules/{name}) starts a run of its flow at each time its
cron expression matches, named `<name>-<UTC time>` and saying its schedule; each time once, also
across its actor's kill -9; a change takes effect at once; a deleted one starts nothing more and
its name can be used again; schedules are per tenant; bad definitions are 400s."""
import json
import time

from actors.schedules import schedule_key
from broker.sharding import actor_name
from harness import get_json, scrape, wait_until

ACME = {"Authorization": "Bearer key-acme", "Content-Type": "application/json"}
GLOBEX = {"Authorization": "Bearer key-globex", "Content-Type": "application/json"}


def call(url, method, body=None, headers=ACME):
    return get_json(url, method=method, headers=headers, body=None if body is None else json.dumps(body).encode())


def runs_in(path):
    """The runs the schedule's flow ran, in order, by the id their client knows."""
    return [line.removeprefix("acme~") for line in path.read_text().split()] if path.exists() else []


def test_a_schedule_starts_one_run_per_time_through_changes_kills_and_its_deletion(make_server, make_worker, tmp_path):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    make_worker(server)
    base, ticks = server.url, tmp_path / "ticks"
    definition = {"flow": "ticked", "cron": "*/2 * * * * *", "input": {"file": str(ticks)}}

    status, _, created = call(f"{base}/v1/schedules/every2", "PUT", definition)
    assert status == 201, created
    assert created["name"] == "every2" and created["timezone"] == "UTC" and created["catchup_secs"] == 60
    assert created["next_at"] % 2 == 0 and created["next_at"] > time.time() - 1
    assert call(f"{base}/v1/schedules/every2", "PUT", definition)[0] == 200          # the same: unchanged
    assert call(f"{base}/v1/schedules/every2", "GET")[2]["cron"] == "*/2 * * * * *"
    assert [s["name"] for s in call(f"{base}/v1/schedules", "GET")[2]["schedules"]] == ["every2"]
    assert call(f"{base}/v1/schedules", "GET", headers=GLOBEX)[2]["schedules"] == []
    assert call(f"{base}/v1/schedules/every2", "GET", headers=GLOBEX)[0] == 404

    wait_until(lambda: len(runs_in(ticks)) >= 2, 30, "two runs of the schedule")
    first = runs_in(ticks)[0]
    assert first.startswith("every2-") and first.endswith("Z")
    run = call(f"{base}/v1/runs/{first}?wait=30", "GET")[2]
    assert run["status"] == "completed" and run["schedule"] == "every2" and run["flow"] == "ticked"
    assert run["scheduled_at"] % 2 == 0 and first == "every2-" + time.strftime(
        "%Y%m%dT%H%M%SZ", time.gmtime(run["scheduled_at"]))
    # the listing finds a schedule's runs by its name, its tenant's only
    listed = [r["run_id"] for r in call(f"{base}/v1/runs?schedule=every2&limit=1000", "GET")[2]["runs"]]
    assert listed[:2] == runs_in(ticks)[:2] and all(r.startswith("every2-") for r in listed), listed
    assert call(f"{base}/v1/runs?schedule=every2", "GET", headers=GLOBEX)[2]["runs"] == []
    assert call(f"{base}/v1/runs?schedule=other", "GET")[2]["runs"] == []

    # Its actor's kill -9: the schedule comes back from its journal and goes on.
    killed_at = time.time()
    server.kill9(actor_name(schedule_key("acme~every2"), 2))
    wait_until(lambda: any(call(f"{base}/v1/runs/{r}", "GET")[2].get("scheduled_at", 0) > killed_at + 1
                           for r in runs_in(ticks)[-2:]), 30, "a run of a time after the kill")

    # A change: every 3 s from now on.
    status, _, changed = call(f"{base}/v1/schedules/every2", "PUT", {**definition, "cron": "*/3 * * * * *"})
    assert status == 200 and changed["cron"] == "*/3 * * * * *" and changed["next_at"] % 3 == 0
    changed_at = time.time()
    wait_until(lambda: any(call(f"{base}/v1/runs/{r}", "GET")[2].get("scheduled_at", 0) > changed_at
                           for r in runs_in(ticks)[-2:]), 30, "a run of the changed schedule")

    assert call(f"{base}/v1/schedules/every2", "DELETE")[0] == 204
    deleted_at = time.time()
    time.sleep(3.5)                                                                  # past its next time
    ran = runs_in(ticks)
    assert len(ran) == len(set(ran)), ran                                            # each time once
    later = [r for r in ran if call(f"{base}/v1/runs/{r}", "GET")[2]["scheduled_at"] > deleted_at + 0.5]
    assert later == [], later                                                        # nothing after its deletion
    times = [call(f"{base}/v1/runs/{r}", "GET")[2]["scheduled_at"] for r in ran]
    assert all(at % 3 == 0 for at in times if at > changed_at)
    started = scrape(base).get('agentos_schedule_starts_total{outcome="started"}', 0)
    assert 0 < started <= len(ran)   # (a killed actor's last second of counts may be lost with it)
    assert call(f"{base}/v1/schedules/every2", "GET")[0] == 404
    assert call(f"{base}/v1/schedules/every2", "DELETE")[0] == 404
    assert call(f"{base}/v1/schedules", "GET")[2]["schedules"] == []
    assert call(f"{base}/v1/schedules/every2", "PUT", {**definition, "cron": "@yearly"})[0] == 201   # its name again

    for name, body, code in (("bad", {**definition, "cron": "* * *"}, "invalid_schedule"),
                             ("bad", {**definition, "cron": "61 * * * *"}, "invalid_schedule"),
                             ("bad", {**definition, "timezone": "Mars/Olympus"}, "invalid_schedule"),
                             ("bad", {**definition, "flow": ""}, "invalid_schedule"),
                             ("bad", {**definition, "catchup_secs": -1}, "invalid_schedule"),
                             ("bad", {**definition, "every": 5}, "invalid_body"),
                             ("bad%20name!", definition, "invalid_schedule_name"),
                             ("x" * 151, definition, "invalid_schedule_name")):
        status, _, error = call(f"{base}/v1/schedules/{name}", "PUT", body)
        assert status == 400 and error["error"]["code"] == code, (name, body, error)
