import asyncio
import time

from actors.tasks import TaskBoard, Timers
from broker.protocol import Kind, Message


def task(i, kind="flow", name="order", run=None):
    return {"task_id": f"t{i}", "kind": kind, "name": name, "run_id": run or f"r{i}", "actor": "actor/0"}


def test_tasks_wait_for_a_capable_worker_with_a_free_slot():
    board = TaskBoard()
    assert board.submit(task(1), 0) == []
    assert board.hello("w1", ["tool:search"], 2, [], 1, 0) == []           # cannot run it
    offers = board.hello("w2", ["flow:order"], 1, [], 1, 0)
    assert [(w, t["task_id"]) for w, t in offers] == [("w2", "t1")]
    assert board.submit(task(2), 0) == []                                 # w2 is full
    assert [(w, t["task_id"]) for w, t in board.done("w2", "t1", 1)] == [("w2", "t2")]


def test_a_decline_puts_the_task_back_first_and_tries_another_worker():
    board = TaskBoard()
    board.hello("w1", ["flow:order"], 1, [], 1, 0)
    board.hello("w2", ["flow:order"], 1, [], 1, 0)
    first = board.submit(task(1), 0)
    board.submit(task(2), 0)
    busy = first[0][0]
    offers = board.decline(busy, "t1", 0)
    assert offers == [] or offers[0][0] != busy
    assert board.stats()["queued"] + len(offers) >= 1


def test_a_newer_task_for_the_same_run_replaces_the_queued_one():
    board = TaskBoard()
    board.submit({**task(1, run="r"), "exec": 1}, 0)
    board.submit({**task(2, run="r"), "exec": 2}, 0)
    offers = board.hello("w", ["flow:order"], 4, [], 1, 0)
    assert [t["exec"] for _, t in offers] == [2]


def test_silent_workers_expire_and_lost_offers_come_back_to_the_slot_count():
    board = TaskBoard(worker_timeout_secs=3, offer_grace_secs=2)
    board.hello("w", ["flow:order"], 1, [], 1, 0)
    board.submit(task(1), 0)
    assert board.submit(task(2), 0) == []
    # The worker never saw t1 (or finished it and the notice was lost): after the grace, the slot is free.
    offers = board.hello("w", ["flow:order"], 1, [], 1, 5)
    assert [t["task_id"] for _, t in offers] == ["t2"]
    assert board.expire(9) == ["w"] and board.stats()["workers"] == 0
    assert [(w, t["task_id"], left) for w, t, left in board.lost] == [("w", "t2", False)]   # what the scheduler reports lost


def test_a_worker_that_says_it_stops_is_gone_at_once_with_its_tasks_lost_and_only_that_incarnation():
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("w", ["flow:order"], 1, [], 7, 0)
    board.submit(task(1), 0)
    assert board.leave("w", 8, 1) is False and board.stats()["workers"] == 1   # not the one that said hello
    assert board.leave("w", 7, 1) is True and board.stats()["workers"] == 0
    assert [(w, t["task_id"], left) for w, t, left in board.lost] == [("w", "t1", True)]   # back to its actor now
    assert board.leave("w", 7, 1) is False and board.expire(10) == []           # once


def test_a_stall_of_the_scheduler_itself_takes_no_worker_for_dead():
    """Workers' hellos wait unread (or bounce) while the scheduler is stopped or starved: after 5 s
    of that, every worker looked silent past its timeout, and its tasks went back as lost."""
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("w", ["flow:order"], 1, [], 1, 0)
    board.submit(task(1), 0)
    board.stalled(5)                 # the ticker's first tick after the stall
    assert board.expire(5.1) == [] and not board.lost
    assert board.expire(8.5) == ["w"] and [t["task_id"] for _, t, _ in board.lost] == ["t1"]   # silent since


def test_a_tool_call_whose_worker_went_goes_first_to_the_next_worker_that_has_it():
    """Its actor's watchdog would send it again only after its grace (4 s): a deploy held every
    tool call in flight that long. Sent again by the actor meanwhile, it is not run twice."""
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("a", ["tool:x"], 1, [], 1, 0)
    board.hello("b", ["tool:x"], 1, [], 1, 0)
    board.hello("c", ["flow:order"], 1, [], 1, 0)
    offers = board.submit(task(1, "tool", "x"), 0) + board.submit(task(2, "tool", "x"), 0)
    assert [w for w, _ in offers] == ["a", "b"]
    assert board.submit(task(3, "tool", "x"), 0) == [] and board.submit(task(4), 0) == [("c", task(4))]
    assert board.leave("a", 1, 1) and not board.lost
    assert [(w, t["task_id"]) for w, t in board.offers(1)] == []          # every worker that has it is busy
    assert board.stats()["queued"] == 2 and board.handed_back_waits(task(1, "tool", "x"))
    assert board.submit(task(1, "tool", "x"), 2) == [] and board.stats()["queued"] == 2   # its actor's again: one
    assert [(w, t["task_id"]) for w, t in board.done("b", "t2", 3)] == [("b", "t1")]   # ahead of t3, queued after it
    assert board.expire(7) == ["b", "c"] and [t["task_id"] for _, t, _ in board.lost] == ["t4"]   # a run's: to its actor
    offers = board.hello("d", ["tool:x"], 2, [], 1, 8)                    # the deploy's new worker
    assert sorted(t["task_id"] for _, t in offers) == ["t1", "t3"]


def test_a_tool_call_handed_back_fails_once_no_worker_has_come_for_it_a_while():
    from actors.tasks import HANDED_BACK_GRACE_SECS as grace
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("a", ["tool:x", "tool:y"], 2, [], 1, 0)
    board.submit(task(1, "tool", "x"), 0)
    board.submit(task(2, "tool", "y"), 0)
    board.leave("a", 1, 1)
    assert board.stranded(1 + grace - 0.1) == [] and board.stats()["queued"] == 2
    board.hello("b", ["tool:y"], 0, [], 1, 2)                      # has y, no free slot: y waits for it
    assert [t["task_id"] for t in board.stranded(1 + grace)] == ["t1"]
    assert board.stats()["queued"] == 1 and not board.handed_back_waits(task(1, "tool", "x"))
    assert board.stranded(100) == []                               # each once


def test_a_tool_call_cancelled_while_with_its_worker_is_not_handed_back_when_the_worker_goes():
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("a", ["tool:x"], 1, [], 1, 0)
    board.submit(task(1, "tool", "x"), 0)
    assert board.cancel("t1") == "a"                               # its worker is told, and still has it
    assert board.expire(4) == ["a"] and board.stats()["queued"] == 0 and board.stranded(100) == []
    assert board.hello("b", ["tool:x"], 1, [], 1, 5) == []


def test_a_worker_taken_for_gone_comes_back_with_its_tool_call_and_keeps_it():
    """Queued again while its worker was stalled, it was offered to that worker once it came back
    still running it: declined, offered, declined, and run once more after it finished."""
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("a", ["tool:x"], 1, [], 1, 0)
    board.submit(task(1, "tool", "x"), 0)
    assert board.expire(4) == ["a"] and board.stats()["queued"] == 1
    assert board.hello("a", ["tool:x"], 1, ["t1"], 1, 5) == []          # its own again, not an offer
    assert board.stats()["queued"] == 0 and board.stats()["assigned"] == 1
    assert board.done("a", "t1", 6) == [] and board.stats()["assigned"] == 0
    assert board.hello("a", ["tool:x"], 1, [], 1, 7) == []


def test_a_task_is_offered_only_while_a_live_worker_has_its_capability():
    board = TaskBoard(worker_timeout_secs=3)
    incr = task(1, "update", "incr")
    assert not board.offered(incr)
    board.hello("w", ["update:incr"], 0, [], 1, 0)          # full, but it has the handler
    assert board.offered(incr) and not board.offered(task(2, "update", "decr"))
    board.expire(9)
    assert not board.offered(incr)


def test_timers_fire_once_in_due_order():
    timers = Timers()
    timers.set("a", "actor/0", "r1", 10)
    timers.set("b", "actor/1", "r2", 5)
    timers.set("a", "actor/0", "r1", 10)  # set again: still once
    assert timers.due(4) == []
    assert timers.due(11) == [("actor/1", "b", "r2"), ("actor/0", "a", "r1")]
    assert timers.due(20) == [] and len(timers) == 0


def test_a_worker_frees_the_slot_of_a_task_cancelled_before_it_ran():
    """The offer and its cancel arrive in one batch: the task never takes a step, yet its slot
    comes back and the scheduler hears it is done (else the worker would run one slot short)."""
    import asyncio
    import logging

    from actors.sdk import App, tool
    from actors.worker_process import SCHEDULER, WorkerRuntime
    from broker.protocol import Kind, Message

    class FakeBus:
        def __init__(self):
            self.handlers, self.sent = {}, []

        def on(self, kind, handler):
            self.handlers[kind] = handler

        def send(self, dest, kind, body):
            self.sent.append((dest, kind, body))

    async def go():
        @tool
        async def slow() -> str:
            await asyncio.sleep(10)
            return "never"

        app = App(tools=[slow])
        bus = FakeBus()
        worker = WorkerRuntime(app, bus, 1, logging.getLogger("test"))
        offer = {"task_id": "t1", "kind": "tool", "name": "slow", "tenant": "", "payload": {}}
        bus.handlers[Kind.TASK_OFFER](Message("scheduler", Kind.TASK_OFFER, 1, 0.0, 0, "", "", offer))
        bus.handlers[Kind.TASK_CANCEL](Message("actor/0", Kind.TASK_CANCEL, 2, 0.0, 0, "", "", {"task_id": "t1"}))
        for _ in range(5):
            await asyncio.sleep(0)
        return worker, bus

    worker, bus = asyncio.run(go())
    assert worker.running == {}
    assert (SCHEDULER, Kind.TASK_DONE, {"task_id": "t1"}) in bus.sent


def test_a_worker_names_the_module_it_cannot_find_and_shows_a_broken_ones_traceback(tmp_path, monkeypatch):
    import pytest

    from actors.worker_apps import load_app
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match="no module named 'no_such_flows_module' here"):
        load_app("no_such_flows_module")
    (tmp_path / "needs_missing_dep.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        load_app("needs_missing_dep")


def test_a_retry_policy_that_would_never_run_a_step_is_refused():
    import pytest

    from actors.sdk import NO_RETRY, Retry
    assert NO_RETRY.max_attempts == 1 and Retry().delay(3) == 0.4
    for bad in ({"max_attempts": 0}, {"max_attempts": 2.5}, {"backoff_secs": -1}, {"multiplier": 0.5}):
        with pytest.raises(ValueError):
            Retry(**bad)


def test_a_timer_that_is_not_a_time_holds_back_no_other():
    """A flow sleeping NaN seconds put NaN on top of the heap: no timer behind it fired again."""
    import asyncio

    import pytest

    from actors.sdk import FlowContext
    timers = Timers()
    timers.set("bad", "actor/0", "r1", float("nan"))
    timers.set("ok", "actor/0", "r2", 10.0)
    assert timers.due(20.0) == [("actor/0", "ok", "r2")] and len(timers) == 0
    ctx = FlowContext(None, "r1", 1, None, [], {})
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            asyncio.run(ctx.sleep(bad))


def test_executions_whose_workers_said_goodbye_go_to_the_next_worker_and_are_not_counted_as_deaths():
    """A run whose workers die with it again and again fails (its code may be what kills them);
    workers stopped cleanly (a deploy, a scale-down) say little of its code."""
    from actors.flow_runs import MAX_LOST_EXECUTIONS
    from test_delayed_starts import sent
    from test_flow_results_due import running_flows

    def lost(run, left):
        return Message("scheduler", Kind.TASK_LOST, 1, time.time(), 0, run.run_id, "",
                       {"run_id": run.run_id, "exec": run.exec, "worker": "worker/0", "left": left})

    async def main():
        flows, bus, _, run = running_flows()
        bus.incarnation = 1
        for _ in range(MAX_LOST_EXECUTIONS + 2):
            flows.on_task_lost(lost(run, left=True))
        assert not run.ended and run.lost == 0
        assert len(sent(bus, Kind.TASK_SUBMIT)) == MAX_LOST_EXECUTIONS + 2   # each to the next worker at once
        for _ in range(MAX_LOST_EXECUTIONS):
            flows.on_task_lost(lost(run, left=False))
        await asyncio.sleep(0.05)   # (the failure is written through the run's log)
        assert run.ended and run.status == "failed", run.status

    asyncio.run(main())


def test_a_run_whose_workers_stop_under_it_with_no_step_between_fails_at_a_far_higher_bound():
    """Flow code that stops its own worker (a SIGTERM to itself) between steps would go from
    worker to worker for as long as workers came back. A step taken between resets the count."""
    from actors.flow_runs import MAX_LEFT_EXECUTIONS
    from test_flow_results_due import running_flows

    def left(run):
        return Message("scheduler", Kind.TASK_LOST, 1, time.time(), 0, run.run_id, "",
                       {"run_id": run.run_id, "exec": run.exec, "worker": "worker/7", "left": True})

    async def main():
        flows, bus, log, run = running_flows()
        bus.incarnation = 1
        for _ in range(MAX_LEFT_EXECUTIONS - 1):
            flows.on_task_lost(left(run))
        await flows.record(run, "step.started", seq=0, name="s", attempt=1)   # it moved on
        for _ in range(MAX_LEFT_EXECUTIONS - 1):
            flows.on_task_lost(left(run))
        await asyncio.sleep(0.05)
        assert not run.ended, run.error
        flows.on_task_lost(left(run))
        await asyncio.sleep(0.05)   # (the failure is written through the run's log)
        assert run.ended and run.status == "failed", run.status
        assert f"its workers stopped under its last {MAX_LEFT_EXECUTIONS} executions (worker/7 the last)" in run.error
        assert log.appended[-1]["type"] == "run.ended", log.appended[-1]

    asyncio.run(main())


def test_the_workers_listed_say_what_each_runs_its_tasks_and_whether_it_drains():
    board = TaskBoard(worker_timeout_secs=3)
    board.hello("w/b", ["flow:order", "tool:x", "update:incr"], 4, [], 1, 10)
    board.hello("w/a", ["tool:x"], 2, [], 1, 11)
    board.submit(task(1), 11)
    board.hello("w/b", ["flow:order", "tool:x", "update:incr"], 0, ["t1"], 1, 12, draining=True)
    assert board.workers_view(13) == [
        {"name": "w/a", "flows": [], "tools": ["x"], "update_handlers": [], "slots": 2, "running": 0,
         "draining": False, "up_secs": 2.0, "seen_secs_ago": 2.0},
        {"name": "w/b", "flows": ["order"], "tools": ["x"], "update_handlers": ["incr"], "slots": 0, "running": 1,
         "draining": True, "up_secs": 3.0, "seen_secs_ago": 1.0}]
    assert board.submit(task(2), 13) == []                        # no slot on the draining worker for a run


def test_the_gauges_count_workers_by_state_their_slots_and_the_tasks_waiting_by_kind():
    board = TaskBoard(worker_timeout_secs=3)
    assert board.gauges() == {"workers": {"serving": 0, "draining": 0}, "slots": {"busy": 0, "free": 0},
                              "waiting": {"flow": 0, "tool": 0, "update": 0}}
    board.submit(task(1, "tool", "x"), 0)
    board.submit(task(2, "update", "incr"), 0)
    board.hello("a", ["flow:order"], 3, [], 1, 0)
    board.submit(task(3), 0)
    board.hello("b", ["tool:y"], 2, [], 1, 0, draining=True)
    assert board.gauges() == {"workers": {"serving": 1, "draining": 1}, "slots": {"busy": 1, "free": 2},
                              "waiting": {"flow": 0, "tool": 1, "update": 1}}
