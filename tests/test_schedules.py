"""Schedules: cron expressions (actors/cron.py) and an actor's schedules (actors/schedules.py)
with fakes for the bus and the log: saved as a run of their own, armed on a timer, each time
starting one run named after it, a time missed while the actor was down started if within the
catch-up, a deletion starting nothing more. The end-to-end case is test_e2e_schedules.py."""
import asyncio
import calendar
import datetime
import time

import pytest

from actors.cron import Cron, CronError
from actors.flow_queues import parse_queues
from actors.flow_state import replay
from actors.schedules import SCHEDULE_FLOW, run_name, schedule_key
from agentos import metrics
from broker.protocol import Kind, Message
from test_flow_results_due import running_flows


def utc(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


def times(cron: Cron, after: str, n: int) -> list[str]:
    out, at = [], utc(after)
    for _ in range(n):
        at = cron.next_after(at)
        out.append(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)))
    return out


def test_cron_fields_ranges_steps_lists_names_and_macros():
    assert times(Cron("*/20 * * * * *"), "2026-12-06T10:00:05", 3) == [
        "2026-12-06T10:00:20", "2026-12-06T10:00:40", "2026-12-06T10:01:00"]
    assert times(Cron("0 9 * * MON-FRI"), "2026-12-04T09:00:00", 2) == [      # a Friday: then Monday
        "2026-12-07T09:00:00", "2026-12-08T09:00:00"]
    assert times(Cron("15,45 */6 * jan,FEB *"), "2026-12-31T23:00:00", 3) == [
        "2027-01-01T00:15:00", "2027-01-01T00:45:00", "2027-01-01T06:15:00"]
    assert times(Cron("0 0 29 2 *"), "2026-01-01T00:00:00", 2) == ["2028-02-29T00:00:00", "2032-02-29T00:00:00"]
    # both days restricted: either matches (the 1st, and Fridays); Sunday is 0 or 7
    assert times(Cron("0 0 1 * 5"), "2026-12-24T00:00:00", 3) == [
        "2026-12-25T00:00:00", "2027-01-01T00:00:00", "2027-01-08T00:00:00"]
    assert times(Cron("0 12 * * 7"), "2026-12-06T12:00:00", 1) == ["2026-12-13T12:00:00"]
    assert times(Cron("@daily"), "2026-12-06T10:00:00", 1) == ["2026-12-07T00:00:00"]
    assert times(Cron("@hourly"), "2026-12-06T10:00:00", 1) == ["2026-12-06T11:00:00"]


def test_cron_in_a_time_zone_across_its_clock_changes():
    berlin = Cron("30 1 * * *", "Europe/Berlin")                    # 01:30 local: 00:30 UTC in winter
    assert times(berlin, "2026-12-06T10:00:00", 1) == ["2026-12-07T00:30:00"]
    summer = Cron("30 1 * * *", "Europe/Berlin")
    assert times(summer, "2026-07-01T10:00:00", 1) == ["2026-07-01T23:30:00"]
    # 2026-10-25 02:30 happens twice in Berlin: started once
    twice = Cron("30 2 * * *", "Europe/Berlin")
    assert times(twice, "2026-10-24T12:00:00", 2) == ["2026-10-25T00:30:00", "2026-10-26T01:30:00"]


def test_times_in_finds_the_latest_times_of_a_window_without_walking_every_second():
    every_second, daily = Cron("* * * * * *"), Cron("0 3 * * *")
    now = utc("2026-12-06T10:00:00") + 0.4
    assert every_second.times_in(now - 7 * 86400, now, 3) == [now - 2.4, now - 1.4, now - 0.4]
    assert every_second.times_in(now - 1.5, now, 100) == [now - 1.4, now - 0.4]    # none before its low
    assert daily.times_in(now - 7 * 86400, now, 2) == [utc("2026-12-05T03:00:00"), utc("2026-12-06T03:00:00")]
    assert daily.times_in(now - 3600, now, 5) == []
    began = time.perf_counter()
    for _ in range(20):
        every_second.times_in(now - 7 * 86400, now, 100)
    assert time.perf_counter() - began < 5   # (a walk over every second of a week: minutes)


@pytest.mark.parametrize("expression,zone,says", [
    ("", "UTC", "five fields"), ("* * *", "UTC", "has 3 fields"), ("61 * * * *", "UTC", "0 to 59"),
    ("0 0 31 2 *", "UTC", "matches no time"), ("5-1 * * * *", "UTC", "backwards"),
    ("*/0 * * * *", "UTC", "above 0"), ("x * * * *", "UTC", "'x'"), ("* * * 13 *", "UTC", "1 to 12"),
    ("* * * * *", "Mars/Olympus", "time zone"), (None, "UTC", "five fields")])
def test_cron_errors_say_what_is_wrong(expression, zone, says):
    with pytest.raises(CronError, match=says):
        Cron(expression, zone)


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30,31 2 *", "* * 31 4,6,9,11 *", "0 0 30-31 FEB *"])
def test_days_no_month_named_has_are_refused_without_a_search(expression, monkeypatch):
    # the search would say so too, but only after 200,000 steps (0.3-0.9 s on the gateway's loop)
    def search(self, start):
        raise AssertionError("searched")
    monkeypatch.setattr(Cron, "_search", search)
    with pytest.raises(CronError, match="matches no time"):
        Cron(expression)


@pytest.mark.parametrize("expression,first", [
    ("0 0 29 2 *", "2000-02-29 00:00"),       # a leap year's day
    ("0 0 31 2 1", "2000-02-07 00:00"),       # both restricted: a Monday of February will do
    ("0 0 31 2,3 *", "2000-03-31 00:00"), ("0 0 30 * 5", "2000-01-07 00:00")])
def test_days_some_month_has_or_a_weekday_beside_them_still_match(expression, first):
    at = Cron(expression).next_after(datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc).timestamp())
    assert datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M") == first


def ask(kind: Kind, body: dict, msg_id: int = 1) -> Message:
    return Message("gateway/0#1", kind, msg_id, time.time(), 0, body.get("key", ""), "", body)


DEFINITION = {"key": "acme~@sched:tick", "tenant": "acme", "name": "tick", "flow": "work", "cron": "* * * * * *",
              "input": {"n": 1}, "catchup_secs": 60.0}


def test_a_schedule_is_saved_as_a_run_armed_on_a_timer_and_each_time_starts_one_named_run():
    async def main():
        flows, bus, log, _ = running_flows()
        started = []

        async def request(dest, kind, body, **_):
            started.append((dest, body))
            return Message(dest, Kind.FLOW_RUN, 9, time.time(), 0, "", "", {"run_id": body["run_id"],
                                                                               "status": "running"})
        bus.request = request
        handlers = flows.handlers()
        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, DEFINITION))
        reply = bus.sent[-1][2]
        assert reply["created"] is True and reply["schedule"]["cron"] == "* * * * * *"
        (record,) = log.appended
        assert record["type"] == "run.started" and record["flow"] == SCHEDULE_FLOW
        assert record["run"].startswith("acme~@sched:tick/") and record["input"]["input"] == {"n": 1}
        timer = next(b for _, k, b in bus.sent if k == Kind.TIMER_SET)
        assert timer["timer_id"] == record["run"] + ":-2" and timer["due"] == reply["schedule"]["next_at"]
        assert not [b for _, k, b in bus.sent if k == Kind.TASK_SUBMIT]   # no worker runs a schedule

        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, DEFINITION, 2))   # the same: nothing written
        assert bus.sent[-1][2]["created"] is False and len(log.appended) == 1

        run = flows.runs[record["run"]]
        await asyncio.sleep(timer["due"] - time.time() + 0.01)
        await flows._timer_fired(run, -2)
        await asyncio.sleep(0.05)
        ((dest, body),) = started
        assert body["run_id"] == run_name("acme~@sched:tick", timer["due"]) == \
            "acme~tick-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(timer["due"]))
        assert body["flow"] == "work" and body["input"] == {"n": 1} and body["schedule"] == "tick"
        assert body["scheduled_at"] == timer["due"] and dest.startswith("actor/")
        assert flows.schedule_next[run.run_id] > timer["due"]             # the next time is armed

        assert "queue" not in body and reply["schedule"]["queue"] is None
        changed = {**DEFINITION, "cron": "0 0 * * *", "queue": "nightly"}   # its runs now wait in a flow queue
        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, changed, 3))
        assert bus.sent[-1][2]["created"] is False and log.appended[-1]["type"] == "attr.set"
        assert bus.sent[-1][2]["schedule"]["queue"] == "nightly"
        assert flows.schedule_next[run.run_id] % 86400 == 0
        started.clear()
        await flows._start_scheduled(run, changed, 86400.0)
        assert started[0][1]["queue"] == "nightly" and "queue_key" not in started[0][1]
        flows.queue_specs = parse_queues("nightly=1 per key")   # a queue per key: the schedule's name is its key
        started.clear()
        await flows._start_scheduled(run, changed, 2 * 86400.0)
        assert started[0][1]["queue_key"] == "tick"

        await handlers[Kind.SCHEDULE_LIST](ask(Kind.SCHEDULE_LIST, {"tenant": "acme"}, 4))
        assert [s["name"] for s in bus.sent[-1][2]["schedules"]] == ["tick"]
        await handlers[Kind.SCHEDULE_LIST](ask(Kind.SCHEDULE_LIST, {"tenant": "globex"}, 5))
        assert bus.sent[-1][2]["schedules"] == []
        await handlers[Kind.SCHEDULE_GET](ask(Kind.SCHEDULE_GET, {"key": "acme~@sched:tick", "tenant": "globex"}))
        assert bus.sent[-1][2] == {"found": False}

        await handlers[Kind.SCHEDULE_DELETE](ask(Kind.SCHEDULE_DELETE, {"key": "acme~@sched:tick", "tenant": "acme"}))
        assert bus.sent[-1][2]["found"] is True and run.ended and log.appended[-1]["type"] == "run.ended"
        assert run.run_id not in flows.schedule_next
        await handlers[Kind.SCHEDULE_GET](ask(Kind.SCHEDULE_GET, {"key": "acme~@sched:tick", "tenant": "acme"}))
        assert bus.sent[-1][2] == {"found": False}
        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, DEFINITION, 6))   # its name again: a new one
        assert bus.sent[-1][2]["created"] is True and log.appended[-1]["run"] != run.run_id

    asyncio.run(main())


@pytest.mark.parametrize("down_for,catchup,started", [(30, 60.0, True), (30, 10.0, False)])
def test_a_time_missed_while_the_actor_was_down_is_started_within_its_catch_up(down_for, catchup, started):
    now = time.time()
    due = float(int(now) - down_for)   # a daily time that passed while nobody ran it
    cron = f"{int(due) % 60} {int(due) // 60 % 60} {int(due) // 3600 % 24} * * *"   # once a day, then
    journal = [{"run": "acme~@sched:daily/1", "tenant": "acme", "type": "run.started", "at": now - 3600, "exec": 0,
                "flow": SCHEDULE_FLOW, "input": {**DEFINITION, "name": "daily", "cron": cron, "catchup_secs": catchup,
                                                 "timezone": "UTC", "updated_at": now - 3600}}]

    async def main():
        flows, bus, log, _ = running_flows()
        asked = []

        async def request(dest, kind, body, **_):
            asked.append(body)
            return Message(dest, Kind.FLOW_RUN, 9, time.time(), 0, "", "", {"run_id": body["run_id"], "status": "x"})
        bus.request = request
        run = flows.runs["acme~@sched:daily/1"] = replay("acme~@sched:daily/1", journal)   # as loaded after a restart
        flows.tick_schedule(run, time.time(), resync=False)
        await asyncio.sleep(0.05)
        assert [b["scheduled_at"] for b in asked] == ([due] if started else [])
        assert flows.schedule_next[run.run_id] > time.time()

    asyncio.run(main())


def test_after_a_restart_each_time_missed_within_the_catch_up_starts_and_no_time_starts_twice_here():
    now = time.time()
    journal = [{"run": "acme~@sched:s/1", "tenant": "acme", "type": "run.started", "at": now - 3600, "exec": 0,
                "flow": SCHEDULE_FLOW, "input": {**DEFINITION, "name": "s", "catchup_secs": 5.0, "timezone": "UTC",
                                                 "updated_at": now - 3600}}]

    async def main():
        flows, bus, log, _ = running_flows()
        asked = []

        async def request(dest, kind, body, **_):
            asked.append(body["scheduled_at"])
            answer = {"run_id": body["run_id"], "status": "x", "created": len(asked) > 2}   # the first two were there
            return Message(dest, Kind.FLOW_RUN, 9, time.time(), 0, "", "", answer)
        bus.request = request
        counted = {o: metrics._counts.get(metrics.schedule_starts.labels(o), 0) for o in ("started", "repeated")}
        run = flows.runs["acme~@sched:s/1"] = replay("acme~@sched:s/1", journal)
        wall = time.time()
        flows.tick_schedule(run, wall, resync=False)
        await asyncio.sleep(0.05)
        assert asked == [float(t) for t in range(int(wall - 5) + 1, int(wall) + 1)]   # the last 5 s, each once
        assert {o: metrics._counts.get(metrics.schedule_starts.labels(o), 0) - n for o, n in counted.items()} == {
            "started": 3, "repeated": 2}                                              # agentos_schedule_starts_total
        flows.tick_schedule(run, flows.schedule_next[run.run_id], resync=False)       # its next time comes
        await asyncio.sleep(0.05)
        assert asked[5:] == [flows.schedule_next[run.run_id] - 1] and len(set(asked)) == 6

    asyncio.run(main())


@pytest.mark.parametrize("change", ["delete", "put"])
def test_a_change_that_comes_before_the_catch_up_still_starts_the_times_missed_before_it(change):
    """Back from a restart (or a stall), the actor starts the times its schedule missed at the
    watchdog's next turn; a deletion or a change can come first (the chaos benchmark, at a quarter
    of a CPU, deleted its schedule as its actor came back: 21 missed seconds never started). Times
    due before the change are started first, under the definition they were due under."""
    now = time.time()
    journal = [{"run": "acme~@sched:tick/1", "tenant": "acme", "type": "run.started", "at": now - 3600, "exec": 0,
                "flow": SCHEDULE_FLOW, "input": {**DEFINITION, "catchup_secs": 5.0, "timezone": "UTC",
                                                 "updated_at": now - 3600}}]

    async def main():
        flows, bus, log, _ = running_flows()
        asked = []

        async def request(dest, kind, body, **_):
            asked.append(body)
            return Message(dest, Kind.FLOW_RUN, 9, time.time(), 0, "", "", {"run_id": body["run_id"], "status": "x",
                                                                               "created": True})
        bus.request = request
        run = flows.runs["acme~@sched:tick/1"] = replay("acme~@sched:tick/1", journal)   # loaded, not yet ticked
        handlers = flows.handlers()
        wall = time.time()
        if change == "delete":
            await handlers[Kind.SCHEDULE_DELETE](ask(Kind.SCHEDULE_DELETE, {"key": DEFINITION["key"], "tenant": "acme"}))
            assert bus.sent[-1][2]["found"] is True and run.ended
        else:
            await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, {**DEFINITION, "cron": "@daily"}))
            assert bus.sent[-1][2]["schedule"]["cron"] == "@daily"
        await asyncio.sleep(0.05)
        got = [b["scheduled_at"] for b in asked]
        assert len(got) == 5 and got == [got[0] + i for i in range(5)]          # the last 5 s, each once
        assert int(wall) <= got[-1] <= time.time()
        assert {(b["flow"], str(b["input"])) for b in asked} == {("work", "{'n': 1}")}

    asyncio.run(main())


def test_schedule_keys_and_run_names_keep_the_tenant():
    assert schedule_key("acme~nightly") == "acme~@sched:nightly" and schedule_key("nightly") == "@sched:nightly"
    assert run_name("@sched:nightly", utc("2026-12-06T01:00:00")) == "nightly-20261206T010000Z"


def test_a_change_or_deletion_the_disk_refused_leaves_the_schedule_as_its_journal_has_it():
    from storage.log_client import LogWriteError

    async def main():
        flows, bus, log, _ = running_flows()
        handlers = flows.handlers()
        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, DEFINITION))
        run = next(r for r in flows.runs.values() if r.flow == SCHEDULE_FLOW)

        async def refuse(kind, body, session, sync=True):
            raise LogWriteError("disk_full", "no space left on device")
        log.append = refuse
        await handlers[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, {**DEFINITION, "cron": "@daily"}, 2))
        assert bus.sent[-1][2]["code"] == "disk_full"
        await handlers[Kind.SCHEDULE_DELETE](ask(Kind.SCHEDULE_DELETE, {"key": DEFINITION["key"], "tenant": "acme"}, 3))
        assert bus.sent[-1][2]["code"] == "disk_full" and not run.ended
        await handlers[Kind.SCHEDULE_GET](ask(Kind.SCHEDULE_GET, {"key": DEFINITION["key"], "tenant": "acme"}, 4))
        assert bus.sent[-1][2]["found"] is True and bus.sent[-1][2]["schedule"]["cron"] == "* * * * * *"

    asyncio.run(main())


def test_an_actor_refuses_a_schedule_a_gateway_would_not_send():
    async def main():
        flows, bus, log, _ = running_flows()
        for wrong in ({"key": "acme~tick"}, {"key": "acme~@sched:other"}, {"key": "acme~@sched:tick/1"},
                      {"catchup_secs": float("nan")}, {"catchup_secs": -1.0}, {"cron": "* *"},
                      {"timezone": "Nowhere/Else"}):
            await flows.handlers()[Kind.SCHEDULE_PUT](ask(Kind.SCHEDULE_PUT, {**DEFINITION, **wrong}))
            assert bus.sent[-1][2]["code"] == "invalid_schedule", wrong
        assert log.appended == [] and not flows.runs.keys() - {"r-1"}

    asyncio.run(main())
