"""A parent and its child asking after each other (actors/run_links.py), with a fake bus and store:
a word between them that was lost (its sender died right after the record it follows) no longer
leaves a parent parked forever or a cancelled parent's child running on."""
import asyncio

import pytest

from actors import run_links
from broker.protocol import Kind, Message
from test_flow_cancel import FakeBus
from test_flow_recovery import AcceptingLog, live_run, restarted

PARKED_ON_A_CHILD = [{"type": "run.started", "flow": "parent", "exec": 5, "input": {}},
                     {"type": "child.started", "seq": 0, "name": "child", "child": "r-1.0"}]

CHILD_ANSWERS = {"completed": {"status": "completed", "result": 7},
                 "failed": {"status": "failed", "error": "boom"},
                 "cancelled": {"status": "cancelled", "error": "cancelled by request"},
                 "running": {"status": "running"},
                 "never began": {"status": "unknown", "code": "not_found", "error": "no such run"}}


def answering(bus: FakeBus, answers: dict[str, dict]):
    async def request(dest, kind, body, **_):
        bus.requests.append((dest, kind, body))
        return Message(dest, Kind.FLOW_RUN, 1, 0.0, 0, body["run_id"], "", {"run_id": body["run_id"],
                                                                            **answers[body["run_id"]]})
    return request


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("child", sorted(CHILD_ANSWERS))
def test_a_parent_recovered_while_parked_on_a_child_asks_how_the_child_stands(child):
    """Its actor died after the child ended (and before it heard so), or before it started the
    child: after the restart the parent records the child's end, or runs again to start it."""
    async def main():
        bus, log = FakeBus(), AcceptingLog()
        bus.request = answering(bus, {"r-1.0": CHILD_ANSWERS[child]})
        flows = await restarted(bus, log, "r-1", PARKED_ON_A_CHILD)
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    assert [(kind, body["run_id"]) for _, kind, body in bus.requests] == [(Kind.FLOW_GET, "r-1.0")]
    op = flows.runs["r-1"].ops[0]
    submitted = [kind for _, kind, _ in bus.sent].count(Kind.TASK_SUBMIT)
    if child in ("completed", "failed", "cancelled"):
        assert op.done and op.ok == (child == "completed")
        if child == "completed":
            assert op.result == 7
        else:
            assert op.error == CHILD_ANSWERS[child]["error"]
        assert [(r["type"], r["seq"]) for r in log.appended] == [("op.done", 0)]
        assert submitted == 1   # and it runs on from there
    elif child == "never began":
        assert not op.done and log.appended == []
        assert submitted == 1   # its replay asks for the child again, with its input, which starts it
    else:
        assert not op.done and log.appended == [] and submitted == 0


PARKED_ON_CHILDREN = PARKED_ON_A_CHILD + [   # started at once (asyncio.gather): the first has ended
    {"type": "child.started", "seq": 1, "name": "child", "child": "r-1.1"},
    {"type": "child.started", "seq": 2, "name": "child", "child": "r-1.2"},
    {"type": "op.done", "seq": 0, "op": "child", "ok": True, "result": 1}]


def test_a_parent_parked_on_children_started_at_once_asks_after_each_open_one():
    """Recovered, and in its live link checks, it asks after every child it waits for, not the
    first alone: the end of a later one, unheard, left it parked until the first ended."""
    answers = {"r-1.1": CHILD_ANSWERS["completed"], "r-1.2": CHILD_ANSWERS["never began"]}

    async def main():
        bus, log = FakeBus(), AcceptingLog()
        bus.request = answering(bus, answers)
        flows = await restarted(bus, log, "r-1", PARKED_ON_CHILDREN)
        await settle()
        recovered = sorted(body["run_id"] for _, _, body in bus.requests)
        run = flows.runs["r-1"]
        bus.requests.clear()
        flows.check_links(run, run.link_checked + run_links.LINK_CHECK_SECS + 1)
        await settle()
        return flows, bus, log, recovered

    flows, bus, log, recovered = asyncio.run(main())
    assert recovered == ["r-1.1", "r-1.2"]
    ops = flows.runs["r-1"].ops
    assert ops[1].done and ops[1].result == 7 and not ops[2].done
    assert [(r["type"], r["seq"]) for r in log.appended] == [("op.done", 1)]
    assert [kind for _, kind, _ in bus.sent].count(Kind.TASK_SUBMIT) >= 1   # runs again: that starts r-1.2
    assert [body["run_id"] for _, _, body in bus.requests] == ["r-1.2"]      # the open one, at the next check


@pytest.mark.parametrize("executing", [False, True])
def test_children_started_at_once_run_their_parent_again_once_the_last_has_ended(executing):
    """Not at each child's end (each new execution would only park again), and not at all under
    an execution that went on past them (it found them ended): that cut it off, and the step it
    was running after them ran again in the next one."""
    async def main():
        flows, bus, run, _ = live_run(PARKED_ON_CHILDREN[:-1], AcceptingLog())
        run.executing = executing   # (False: parked, or loaded from its journal)
        submits = []
        for seq in (1, 0, 2):
            await flows.on_child_done(Message("actor/0", Kind.FLOW_CHILD_DONE, seq, 0.0, 0, "r-1", "",
                                              {"run_id": "r-1", "seq": seq, "child": f"r-1.{seq}", "ok": True,
                                               "result": seq}))
            submits.append([kind for _, kind, _ in bus.sent].count(Kind.TASK_SUBMIT))
        return submits

    assert asyncio.run(main()) == ([0, 0, 0] if executing else [0, 0, 1])


def test_a_wide_fan_out_runs_its_parent_again_once_after_the_last_end_through_a_restart():
    """500 children started at once end in no order; the parent's actor restarts halfway (the
    open ones come back from the journal). The parent runs again once, at the last end, and its
    link checks ask after exactly the children still open."""
    import random
    order = list(range(500))
    random.Random(7).shuffle(order)
    started = [{"type": "run.started", "flow": "parent", "exec": 5, "input": {}}] + [
        {"type": "child.started", "seq": seq, "name": "child", "child": f"r-1.{seq}"} for seq in range(500)]

    def done(seq: int) -> Message:
        return Message("actor/0", Kind.FLOW_CHILD_DONE, seq, 0.0, 0, "r-1", "",
                       {"run_id": "r-1", "seq": seq, "child": f"r-1.{seq}", "ok": True, "result": seq})

    async def main():
        flows, bus, run, _ = live_run(started, AcceptingLog())
        for seq in order[:250]:
            await flows.on_child_done(done(seq))
        first_half = [kind for _, kind, _ in bus.sent].count(Kind.TASK_SUBMIT)
        journal = started + [{"type": "op.done", "seq": seq, "op": "child", "ok": True, "result": seq}
                             for seq in order[:250]]
        bus2, log2 = FakeBus(), AcceptingLog()
        bus2.request = answering(bus2, {f"r-1.{seq}": CHILD_ANSWERS["running"] for seq in range(500)})
        again = await restarted(bus2, log2, "r-1", journal)
        await settle()
        asked = sorted(int(body["run_id"].rsplit(".", 1)[1]) for _, _, body in bus2.requests)
        submits = []
        for seq in order[250:]:
            await again.on_child_done(done(seq))
            submits.append([kind for _, kind, _ in bus2.sent].count(Kind.TASK_SUBMIT))
        return first_half, asked, submits, again.runs["r-1"]

    first_half, asked, submits, run = asyncio.run(main())
    assert first_half == 0
    assert asked == sorted(order[250:])
    assert submits == [0] * 249 + [1]
    assert all(op.done and op.result == seq for seq, op in run.ops.items()) and not run.open_children


def test_a_live_parent_asks_after_its_child_only_once_a_link_check_is_due():
    """The child's actor died between appending its end and telling the parent, whose actor lived on."""
    async def main():
        flows, bus, run, _ = live_run(PARKED_ON_A_CHILD, AcceptingLog())
        bus.request = answering(bus, {"r-1.0": CHILD_ANSWERS["completed"]})
        flows.check_links(run, run.link_checked + run_links.LINK_CHECK_SECS / 2)
        await settle()
        assert bus.requests == [] and not run.ops[0].done
        flows.check_links(run, run.link_checked + run_links.LINK_CHECK_SECS + 1)
        await settle()
        return bus, run

    bus, run = asyncio.run(main())
    assert [(kind, body["run_id"]) for _, kind, body in bus.requests] == [(Kind.FLOW_GET, "r-1.0")]
    assert run.ops[0].done and run.ops[0].result == 7


@pytest.mark.parametrize("parent", ["running", "cancelled"])
def test_the_watchdog_cancels_a_live_child_whose_parents_cancel_was_lost(monkeypatch, parent):
    """The parent's actor died between appending its end and telling the child, whose actor lived on."""
    monkeypatch.setattr(run_links, "LINK_CHECK_SECS", 0.0)
    child = [{"type": "run.started", "flow": "child", "exec": 5, "input": {}, "parent": "p-1", "parent_seq": 0,
              "parent_actor": "actor/1"},
             {"type": "sleep", "seq": 0, "name": "sleep", "due": 4102444800.0}]

    async def main():
        flows, bus, run, _ = live_run(child, AcceptingLog())
        bus.request = answering(bus, {"p-1": {"status": parent}})
        watchdog = asyncio.ensure_future(flows.watchdog())
        try:
            for _ in range(30):   # its first round is a second after it starts
                await asyncio.sleep(0.1)
                if bus.requests and (run.ended or parent == "running"):
                    break
        finally:
            watchdog.cancel()
        return bus, run, flows.journal_log.appended

    bus, run, appended = asyncio.run(main())
    assert ("actor/1", Kind.FLOW_GET, {"run_id": "p-1", "tenant": "t"}) in bus.requests
    if parent == "cancelled":
        assert run.status == "cancelled" and "p-1" in run.error
        assert [(r["type"], r["status"]) for r in appended] == [("run.ended", "cancelled")]
    else:
        assert not run.ended and appended == []


def test_a_parent_that_fails_while_parked_on_a_child_cancels_the_child(monkeypatch):
    """Its journal passed the size limit (a message published to it): the child's result would go
    nowhere, so the child is cancelled, and its end names the parent's failure."""
    from actors import flow_runs

    monkeypatch.setattr(flow_runs, "MAX_RUN_BYTES", 1000)

    async def main():
        flows, bus, run, _ = live_run(PARKED_ON_A_CHILD, AcceptingLog())
        await flows.on_publish(Message("gateway/0", Kind.CHANNEL_PUBLISH, 1, 0.0, 0, "r-1", "",
                                       {"run_id": "r-1", "tenant": "t", "channel": "inbox", "message": "x" * 2000}))
        await settle()
        return bus, run

    bus, run = asyncio.run(main())
    assert run.status == "failed" and "passed" in run.error
    cancels = [(dest, body) for dest, kind, body in bus.requests if kind == Kind.FLOW_CANCEL]
    assert [body["run_id"] for _, body in cancels] == ["r-1.0"]
    assert cancels[0][1]["why"] == "its parent r-1 failed"


@pytest.mark.parametrize("parent_actor,started", [("a" * 80, False), ("gateway/0", False), (7, False),
                                                   ("actor/1", True), ("", True)])
def test_a_childs_start_names_an_actor_as_its_parents_or_none(parent_actor, started):
    """A start from a peer naming anything else as the parent's actor was taken: the child ran,
    and its end could not be sent anywhere (a task failing on an unencodable name)."""
    async def main():
        flows, bus, _, _ = live_run([], AcceptingLog())
        body = {"run_id": "kid", "tenant": "t", "flow": "child", "input": {}, "parent": "p-1", "parent_seq": 0,
                "parent_actor": parent_actor}
        await flows.on_start(Message("actor/1", Kind.FLOW_START, 1, 0.0, 0, "kid", "", body))
        (_, kind, reply), = [sent for sent in bus.sent if sent[1] == Kind.FLOW_RUN]
        return "kid" in flows.runs, reply, flows.journal_log.appended

    created, reply, appended = asyncio.run(main())
    assert created is started and bool(appended) is started, reply
    if not started:
        assert reply["status"] == "error" and "parent_actor" in reply["error"], reply
