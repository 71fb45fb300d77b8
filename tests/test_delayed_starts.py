"""A delayed start (`start_at`): the run exists at once and is told as `scheduled`; its actor
sets a timer instead of dispatching it, and dispatches it when the timer fires, or when its
watchdog finds the time passed (a lost timer) — once either way. A run replayed from its journal
after a restart waits again for what is left of its delay. The gateway's parsing of the time."""
import asyncio
import time

import pytest

from actors.flow_state import replay
from broker.protocol import Kind, Message
from gateway.errors import ApiError
from gateway.flows import MAX_DELAY_SECS, _start_at
from test_flow_results_due import running_flows


def start(body: dict, msg_id: int = 1) -> Message:
    return Message("gateway/0#1", Kind.FLOW_START, msg_id, time.time(), 0, body["run_id"], "", body)


def sent(bus, kind):
    return [body for _, k, body in bus.sent if k == kind]


def test_a_delayed_run_is_scheduled_with_a_timer_and_dispatched_once_when_it_fires():
    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 1
        at = time.time() + 0.5
        await flows.handlers()[Kind.FLOW_START](start({"flow": "f", "input": 1, "run_id": "d-1", "tenant": "t",
                                                       "start_at": at, "new": True}))
        reply = bus.sent[-1][2]
        assert reply["created"] is True and reply["status"] == "scheduled" and reply["start_at"] == at
        (started,) = [b for b in log.appended if b["run"] == "d-1"]
        assert started["start_at"] == at                                  # in its journal: a restart keeps it
        assert not [b for b in sent(bus, Kind.TASK_SUBMIT) if b["run_id"] == "d-1"]
        (timer,) = sent(bus, Kind.TIMER_SET)
        assert timer == {"timer_id": "d-1:-1", "run_id": "d-1", "due": at}

        run = flows.runs["d-1"]
        await flows._timer_fired(run, -1)                                 # early (a clock's step): nothing
        assert not sent(bus, Kind.TASK_SUBMIT)
        await asyncio.sleep(at - time.time() + 0.01)
        await flows._timer_fired(run, -1)
        await flows._timer_fired(run, -1)                                 # the scheduler said it twice
        (submit,) = sent(bus, Kind.TASK_SUBMIT)
        assert submit["run_id"] == "d-1" and submit["payload"]["input"] == 1
        assert run.summary()["status"] == "running" and run.summary()["start_at"] == at

    asyncio.run(main())


def test_a_cancelled_delayed_run_is_not_dispatched_when_its_time_comes():
    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 1
        at = time.time() + 0.2
        await flows.handlers()[Kind.FLOW_START](start({"flow": "f", "run_id": "d-2", "tenant": "t",
                                                       "start_at": at, "new": True}))
        await flows.handlers()[Kind.FLOW_CANCEL](Message("gateway/0#1", Kind.FLOW_CANCEL, 2, time.time(), 0, "d-2", "",
                                                         {"run_id": "d-2", "tenant": "t"}))
        assert bus.sent[-1][2]["status"] == "cancelled"
        await asyncio.sleep(0.25)
        await flows._timer_fired(flows.runs["d-2"], -1)
        assert not sent(bus, Kind.TASK_SUBMIT)

    asyncio.run(main())


def test_a_lost_timer_leaves_it_to_the_watchdog_and_a_replayed_run_waits_for_what_is_left():
    records = [{"run": "d-3", "tenant": "t", "type": "run.started", "at": time.time(), "exec": 0, "flow": "f",
                "input": None, "start_at": time.time() + 60}]
    run = replay("d-3", records)
    assert run.summary()["status"] == "scheduled" and run.waits_to_start(time.time())
    assert not run.waits_to_start(time.time() + 61)

    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 1
        flows.runs["d-3"] = run
        flows.resume(run)                                                 # as after a restart
        (timer,) = sent(bus, Kind.TIMER_SET)
        assert timer["timer_id"] == "d-3:-1" and timer["due"] == run.start_at
        run.start_at = time.time() - 1                                    # its time passed; the timer was lost
        assert flows.blocked_on(run) is None                              # the watchdog dispatches a run so
        flows.dispatch(run)
        await flows._timer_fired(run, -1)                                 # the late timer does not again
        assert len(sent(bus, Kind.TASK_SUBMIT)) == 1

    asyncio.run(main())


def test_an_actor_refuses_a_start_time_that_is_no_time_and_a_delayed_fork():
    async def main():
        flows, bus, _, _ = running_flows()
        handle = flows.handlers()[Kind.FLOW_START]
        for body in ({"flow": "f", "start_at": float("inf")}, {"flow": "f", "start_at": float("nan")},
                     {"fork_of": "r-1", "start_at": time.time() + 5}):
            await handle(start({**body, "run_id": "d-4", "tenant": "t", "new": True}))
            assert bus.sent[-1][2]["code"] == "conflict" and "d-4" not in flows.runs

    asyncio.run(main())


def test_the_gateway_reads_start_at_as_epoch_seconds_or_iso_time_and_delay_secs_from_now():
    now = time.time()
    assert _start_at({}) is None
    assert now + 29 < _start_at({"delay_secs": 30}) < time.time() + 31
    assert _start_at({"delay_secs": 0}) is None                           # at once
    assert _start_at({"start_at": now + 100}) == now + 100
    assert _start_at({"start_at": now - 100}) is None                     # a time past: at once
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now + 3600))
    assert abs(_start_at({"start_at": iso}) - (now + 3600)) < 1
    for body in ({"start_at": "tomorrow"}, {"start_at": "2026-12-06T10:00:00"}, {"start_at": True},
                 {"start_at": "2099-01-01T00:00:00Z"},
                 {"start_at": now + MAX_DELAY_SECS + 60}, {"start_at": float("nan")}, {"delay_secs": -1},
                 {"delay_secs": "5"}, {"delay_secs": MAX_DELAY_SECS + 1}, {"start_at": now + 5, "delay_secs": 5},
                 {"start_at": [1]}):
        with pytest.raises(ApiError) as err:
            _start_at(body)
        assert err.value.status == 400 and err.value.code == "invalid_start_at", body


def test_a_run_past_its_timeout_ends_cancelled_and_says_why():
    now = time.time()
    run = replay("d-5", [{"run": "d-5", "tenant": "t", "type": "run.started", "at": now - 10, "exec": 0,
                          "flow": "f", "input": None, "timeout_secs": 4, "start_at": now - 8}])
    assert run.timeout_at == now - 4 and run.summary()["timeout_at"] == now - 4   # from its start_at
    assert replay("d-6", [{"run": "d-6", "tenant": "t", "type": "run.started", "at": now, "exec": 0, "flow": "f",
                           "input": None}]).timeout_at == 0.0

    async def main():
        flows, bus, log, _ = running_flows()
        flows.runs["d-5"] = run
        await flows.time_out(run)
        assert run.status == "cancelled" and "timed out: not ended 4 s after it began" in run.error
        assert log.appended[-1]["type"] == "run.ended" and not run.timing_out

    asyncio.run(main())
