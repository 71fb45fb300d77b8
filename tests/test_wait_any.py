"""`ctx.wait_any`: one wait for the first message on any of several channels, with fakes for the
bus and the log (end to end: test_e2e_flow_concurrency.py)."""
import asyncio
import time

import pytest

from actors.flow_context import FlowContext
from actors.flow_state import Run, apply
from broker.protocol import Kind, Message
from storage.log_client import LogWriteError
from test_flow_patches import Runtime
from test_flow_recovery import AcceptingLog, restarted
from test_flow_results_due import from_worker, running_flows
from test_run_links import FakeBus

WAIT_ANY = {"type": "wait", "seq": 0, "name": "approve|reject", "channel": "approve",
            "channels": ["approve", "reject"], "due": 0.0}


def publish(channel: str, message) -> Message:
    return Message("gateway/0", Kind.CHANNEL_PUBLISH, 1, 0.0, 0, "r-1", "",
                   {"run_id": "r-1", "tenant": "t", "channel": channel, "message": message})


def submits(bus) -> int:
    return [kind for _, kind, _ in bus.sent].count(Kind.TASK_SUBMIT)


def parked(flows, run: Run) -> None:
    flows.bus.incarnation = 2
    apply(run, {"run": "r-1", "tenant": "t", "at": time.time(), "exec": 7, **WAIT_ANY})
    run.status = "suspended"
    assert flows.blocked_on(run) is run.ops[0]


def test_a_message_on_any_of_its_channels_wakes_the_wait_and_says_which():
    async def main():
        flows, bus, log, run = running_flows()
        parked(flows, run)
        await flows.on_publish(publish("other", "not for it"))
        assert not run.ops[0].done and submits(bus) == 0
        await flows.on_publish(publish("reject", {"why": "too dear"}))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert run.ops[0].done and run.ops[0].result == ["reject", {"why": "too dear"}]
    assert [(r["type"], r.get("channel"), r.get("msg_seq")) for r in log.appended[-3:]] == [
        ("message", "reject", 2), ("message.taken", "reject", 2), ("op.done", None, None)]
    assert submits(bus) == 1 and list(run.channels["other"]) == [(1, "not for it")]


def test_the_wait_takes_the_first_published_of_the_messages_waiting_for_it():
    async def main():
        flows, bus, log, run = running_flows()
        for channel, message in (("reject", "r1"), ("approve", "a1"), ("reject", "r2")):
            await flows.on_publish(publish(channel, message))
        first = from_worker(Kind.STEP_START, 1, seq=0, op="wait", name="approve|reject", channel="approve",
                            channels=["approve", "reject"])
        await flows.on_step_start(first)
        answer = bus.sent[-1]
        apply(run, {"run": "r-1", "tenant": "t", "exec": 7, **{**WAIT_ANY, "seq": 1}})
        await flows._take_message(run, run.ops[1])
        return answer, run

    answer, run = asyncio.run(main())
    assert answer[1:] == (Kind.STEP_GO, {"action": "continue", "ok": True, "result": ["reject", "r1"]})
    assert run.ops[1].result == ["approve", "a1"] and list(run.channels["reject"]) == [(3, "r2")]


def test_a_run_recovered_while_waiting_on_several_channels_takes_a_message_that_came_meanwhile():
    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}}, WAIT_ANY,
               {"type": "message", "channel": "reject", "msg_seq": 1, "message": "no"}]

    async def main():
        bus, log = FakeBus(), AcceptingLog()
        flows = await restarted(bus, log, "r-1", journal)
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    op = flows.runs["r-1"].ops[0]
    assert op.done and op.result == ["reject", "no"] and submits(bus) == 1
    assert op.view(False)["channels"] == ["approve", "reject"]


class RefusingLog(AcceptingLog):
    """A full disk: every record is refused, after the actor's watchdog looked at the run."""

    def __init__(self, flows_of) -> None:
        super().__init__()
        self.flows_of = flows_of

    async def append(self, kind, body, session, sync=True):
        flows, run = self.flows_of()
        flows.blocked_on(run)   # (the watchdog, while the taking was in memory alone)
        await asyncio.sleep(0)
        raise LogWriteError("disk_full", "log write failed: No space left on device")


def test_a_refused_publish_leaves_the_wait_open_and_the_next_publish_wakes_it():
    async def main():
        flows, bus, _, run = running_flows()
        parked(flows, run)
        flows.journal_log = RefusingLog(lambda: (flows, run))
        await flows.on_publish(publish("approve", "yes"))
        refused = bus.sent[-1]
        assert flows.blocked_on(run) is run.ops[0] and not run.ops[0].done and run.waiting == 0
        assert not run.channels.get("approve")
        flows.journal_log = AcceptingLog()
        await flows.on_publish(publish("approve", "yes, now"))
        return refused, run

    refused, run = asyncio.run(main())
    assert refused[1] == Kind.FLOW_ACK and refused[2]["ok"] is False and refused[2]["code"] == "disk_full"
    assert run.ops[0].done and run.ops[0].result == ["approve", "yes, now"]


@pytest.mark.parametrize("channels", [[], ["a", "a"], ["a", 2], ["a", ""], [f"c{i}" for i in range(101)]])
def test_a_wait_on_channels_no_flow_could_ask_for_is_refused_and_records_nothing(channels):
    async def main():
        flows, bus, log, run = running_flows()
        await flows.on_step_start(from_worker(Kind.STEP_START, 1, seq=0, op="wait", name="w", channel="a",
                                              channels=channels))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert bus.sent[-1][1] == Kind.STEP_GO and bus.sent[-1][2]["action"] == "fail"
    assert log.appended == [] and 0 not in run.ops


def test_the_sdk_checks_the_channels_and_a_replay_returns_the_recorded_channel():
    ctx = FlowContext(Runtime({}), "r-1", 1, None, [{"seq": 0, "op": "wait", "name": "approve|reject", "ok": True,
                                                    "result": ["reject", "no"]}], {})
    assert asyncio.run(ctx.wait_any(["approve", "reject"])) == ("reject", "no")
    for bad, error in (("approve", TypeError), ([], ValueError), (["a", "a"], ValueError), (["a", 1], ValueError)):
        with pytest.raises(error):
            asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).wait_any(bad))


def test_a_parked_run_says_what_it_waits_for_and_a_running_one_does_not():
    run = Run("r-1", "steps", "t")
    for record in ({"type": "run.started", "flow": "steps", "exec": 1, "input": {}, "at": 1.0},
                   {"type": "step.done", "seq": 0, "name": "s", "ok": True, "result": 1, "at": 2.0},
                   {"type": "sleep", "seq": 1, "name": "sleep", "due": 99.0, "at": 3.0}):
        apply(run, {"run": "r-1", "tenant": "t", **record})
    run.status = "suspended"
    assert run.summary()["waiting_on"] == {"op": "sleep", "seq": 1, "since": 3.0, "due": 99.0}
    apply(run, {"run": "r-1", "tenant": "t", "type": "op.done", "seq": 1, "op": "sleep", "ok": True, "at": 4.0})
    apply(run, {"run": "r-1", "tenant": "t", "at": 5.0, "exec": 1, **{**WAIT_ANY, "seq": 2, "due": 60.0}})
    assert run.summary()["waiting_on"] == {"op": "wait", "seq": 2, "since": 5.0, "channels": ["approve", "reject"],
                                           "due": 60.0}
    run.status = "running"
    assert "waiting_on" not in run.summary()


@pytest.mark.parametrize("due", [1234.5, float("nan"), 0.0, None])
def test_a_waits_timeout_is_due_when_its_worker_says_if_that_is_a_time(due):
    async def main():
        flows, bus, log, run = running_flows()
        flows.set_timer = lambda run, op: None
        fields = {"timeout": 5.0, **({"due": due} if due is not None else {})}
        before = time.time()
        await flows.on_step_start(from_worker(Kind.STEP_START, 1, seq=0, op="wait", name="w", channel="w", **fields))
        return run.ops[0].due, before

    recorded, before = asyncio.run(main())
    assert recorded == 1234.5 if due == 1234.5 else before + 5.0 <= recorded <= time.time() + 5.0
