"""A fork begins, in one record, with the original's outcomes before its seq, the attributes as
they were when that operation began, and the messages no copied wait took; a run replayed from
that record is the fork, and its first execution replays the copied outcomes. A repeated fork
answers the same run; another request under its id is refused (unit, with the fakes of
test_flow_results_due.py)."""
import asyncio
import time

import pytest

from actors.flow_state import replay
from actors.run_forks import ForkRefused, fork_fields
from broker.protocol import Kind, Message
from test_flow_results_due import running_flows


def journal() -> list[dict]:
    """A run that took a message, had an attribute set by its code and one by an update handler
    on each side of its third operation's start, and failed there."""
    rows = [("run.started", {"flow": "f", "input": 5}),
            ("step.started", {"seq": 0, "name": "a", "attempt": 1}),
            ("step.done", {"seq": 0, "name": "a", "ok": True, "result": 10, "attempt": 1}),
            ("attr.set", {"key": "k", "value": 1, "seq": 1}),
            ("op.done", {"seq": 1, "op": "attr_set", "name": "k", "ok": True}),
            ("message", {"channel": "inbox", "msg_seq": 1, "message": "m1"}),
            ("message", {"channel": "inbox", "msg_seq": 2, "message": "m2"}),
            ("wait", {"seq": 2, "name": "inbox", "channel": "inbox", "due": 0}),
            ("message.taken", {"seq": 2, "channel": "inbox", "msg_seq": 1}),
            ("op.done", {"seq": 2, "op": "wait", "name": "inbox", "ok": True, "result": "m1"}),
            ("attr.set", {"key": "h", "value": "early", "seq": -1}),
            ("step.started", {"seq": 3, "name": "b", "attempt": 1}),
            ("attr.set", {"key": "h", "value": "late", "seq": -1}),
            ("step.done", {"seq": 3, "name": "b", "ok": False, "error": "boom", "attempt": 1}),
            ("run.ended", {"status": "failed", "error": "boom"})]
    return [{"run": "src", "tenant": "t", "type": kind, "at": 100.0 + i, "exec": 1, **fields}
            for i, (kind, fields) in enumerate(rows)]


def test_a_fork_copies_the_outcomes_before_its_seq_the_attributes_of_then_and_the_untaken_messages():
    records = journal()
    by_default = fork_fields("src", records, "t", None)   # from the first that did not succeed: step b
    assert by_default["fork_seq"] == 3 and (by_default["flow"], by_default["input"]) == ("f", 5)
    assert [c["seq"] for c in by_default["copied"]] == [0, 1, 2]
    assert by_default["copied"][2] == {"seq": 2, "op": "wait", "name": "inbox", "ok": True, "attempts": 0,
                                       "started_at": 107.0, "ended_at": 109.0, "result": "m1", "channel": "inbox"}
    assert by_default["attrs"] == {"k": 1, "h": "early"}          # not the handler's write after b began
    assert by_default["messages"] == [["inbox", 2, "m2"]]         # m1 was taken by the copied wait

    at_wait = fork_fields("src", records, "t", 2)
    assert at_wait["attrs"] == {"k": 1} and at_wait["messages"] == [["inbox", 1, "m1"], ["inbox", 2, "m2"]]
    at_start = fork_fields("src", records, "t", 0)
    assert at_start["copied"] == [] and at_start["attrs"] == {} and len(at_start["messages"]) == 2
    past_failure = fork_fields("src", records, "t", 4)            # the failed outcome replays too
    assert past_failure["copied"][3]["ok"] is False and past_failure["copied"][3]["error"] == "boom"
    assert past_failure["attrs"] == {"k": 1, "h": "late"}         # the cut is the run's end

    with pytest.raises(ForkRefused, match="at most 4") as refused:
        fork_fields("src", records, "t", 5)
    assert refused.value.code == "not_forkable"
    for rows, tenant in ((records, "other"), ([], "t")):
        with pytest.raises(ForkRefused) as refused:
            fork_fields("src", rows, tenant, None)
        assert refused.value.code == "not_found"
    turn = [{**records[0], "flow": "turn"}]
    with pytest.raises(ForkRefused, match="agent turn"):
        fork_fields("s/t1", turn, "t", None)

    # Running: a fork of an open run goes on from its first unfinished operation.
    open_run = [r for r in records if not (r["type"] in ("step.done", "run.ended") and r.get("seq", 3) == 3)]
    assert fork_fields("src", open_run, "t", None)["fork_seq"] == 3
    with pytest.raises(ForkRefused):
        fork_fields("src", open_run, "t", 4)


def test_a_run_replayed_from_a_forks_start_is_the_fork():
    records = journal()
    source = replay("src", records)
    started = {"run": "fork-1", "tenant": "t", "type": "run.started", "at": 500.0, "exec": 1,
               **fork_fields("src", records, "t", None)}
    fork = replay("fork-1", [started])
    assert fork.status == "running" and (fork.flow, fork.input) == ("f", 5)
    assert fork.journal() == source.journal()[:3]                       # what its first execution replays
    assert [fork.ops[s].view(False) for s in range(3)] == [source.ops[s].view(False) for s in range(3)]
    assert fork.attrs == {"k": 1, "h": "early"} and fork.msg_counter == 2
    assert list(fork.channels["inbox"]) == [(2, "m2")]
    assert fork.summary()["forked_from"] == "src" and fork.summary()["fork_seq"] == 3
    assert fork.summary()["started_at"] == 500.0
    assert fork.journal_bytes >= len("m1") + len("m2") + len("early")   # its copied values count toward the limit
    assert "forked_from" not in source.summary()


def test_a_fork_of_a_fork_keeps_what_the_first_began_with_and_goes_no_earlier():
    records = journal()
    first = {"run": "f1", "tenant": "t", "type": "run.started", "at": 500.0, "exec": 1,
             **fork_fields("src", records, "t", 3)}
    own = [("step.started", {"seq": 3, "name": "b", "attempt": 1}),
           ("attr.set", {"key": "mine", "value": 2, "seq": -1}),
           ("step.done", {"seq": 3, "name": "b", "ok": True, "result": "fixed", "attempt": 1}),
           ("message", {"channel": "inbox", "msg_seq": 3, "message": "m3"})]
    fork_journal = [first] + [{"run": "f1", "tenant": "t", "type": kind, "at": 600.0 + i, "exec": 2, **fields}
                              for i, (kind, fields) in enumerate(own)]
    second = fork_fields("f1", fork_journal, "t", 4)
    assert [c["seq"] for c in second["copied"]] == [0, 1, 2, 3] and second["copied"][3]["result"] == "fixed"
    assert second["attrs"] == {"k": 1, "h": "early", "mine": 2}                # the first's, then its own
    assert second["messages"] == [["inbox", 2, "m2"], ["inbox", 3, "m3"]]     # carried over, then received
    again = fork_fields("f1", fork_journal, "t", 3)                           # from where the first began
    assert again["attrs"] == {"k": 1, "h": "early"} and len(again["messages"]) == 2
    with pytest.raises(ForkRefused, match="fork the run it was forked from"):
        fork_fields("f1", fork_journal, "t", 2)


def start(body: dict, msg_id: int) -> Message:
    return Message("gateway/0#1", Kind.FLOW_START, msg_id, time.time(), 0, body["run_id"], "", body)


def test_a_repeated_fork_is_the_same_run_and_another_request_under_its_id_is_refused():
    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 1
        asked = []

        async def store(what, run_id, sync=False):
            asked.append((what, run_id, sync))
            return {"rows": journal() if run_id == "src" else []}
        flows.query = store
        handle = flows.handlers()[Kind.FLOW_START]
        await handle(start({"fork_of": "src", "fork_seq": None, "run_id": "f-1", "tenant": "t"}, 1))
        reply = bus.sent[-1][2]
        assert reply["created"] is True and reply["forked_from"] == "src" and reply["fork_seq"] == 3
        assert ("flow_records", "src", True) in asked               # read as of every acknowledged record
        (started,) = [b for b in log.appended if b["run"] == "f-1"]
        assert started["type"] == "run.started" and len(started["copied"]) == 3
        submit = next(b for _, kind, b in bus.sent if kind == Kind.TASK_SUBMIT and b["run_id"] == "f-1")
        assert [o["seq"] for o in submit["payload"]["journal"]] == [0, 1, 2]
        assert submit["payload"]["attrs"] == {"k": 1, "h": "early"} and submit["name"] == "f"

        for body, code in (({"fork_of": "src", "fork_seq": 3}, None), ({"fork_of": "src"}, None),
                           ({"fork_of": "src", "fork_seq": 0}, "conflict"), ({"fork_of": "other"}, "conflict"),
                           ({"flow": "f", "input": 6}, "conflict"),   # a plain start under the fork's id
                           ({"fork_of": "src", "fork_seq": -1}, "conflict"), ({"fork_of": 7}, "conflict"),
                           ({"fork_of": "src", "fork_seq": "3"}, "conflict")):
            await handle(start({**body, "run_id": "f-1", "tenant": "t"}, 2))
            reply = bus.sent[-1][2]
            assert reply.get("code") == code, (body, reply)
        await handle(start({"fork_of": "nope", "run_id": "f-2", "tenant": "t", "new": True}, 3))
        assert bus.sent[-1][2]["code"] == "not_found" and "f-2" not in flows.runs
        assert len([b for b in log.appended if b["run"] == "f-1"]) == 1   # nothing more was written

    asyncio.run(main())

