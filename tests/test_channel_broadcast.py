"""A publish to a channel of the tenant (`POST /v1/channels/{name}`, `ctx.publish`): each run
waiting on it now takes it, the others do not (actors/run_messages.py `on_broadcast`), with fakes
for the bus and the log (end to end: test_e2e_flow_concurrency.py)."""
import asyncio
import time

import pytest

from actors import run_messages
from actors.flow_context import FlowContext
from actors.flow_state import Run, apply
from broker.client import BusError
from broker.protocol import Kind, Message
from storage.log_client import LogWriteError
from test_flow_patches import Runtime
from test_flow_results_due import from_worker, running_flows


def flows_of_runs():
    flows, bus, log, _ = running_flows()   # r-1 runs a step: it waits on no channel
    bus.incarnation = 2
    return flows, bus, log


def add_run(flows, run_id: str, flow: str = "steps", tenant: str = "t", waits_on: tuple = (), attrs=None) -> Run:
    """A run of `flow` in execution 7, parked on a wait of `waits_on` (none: running a step)."""
    run = Run(run_id, flow, tenant)
    at = time.time()
    apply(run, {"run": run_id, "tenant": tenant, "at": at, "type": "run.started", "flow": flow, "exec": 7,
                "input": {}})
    for key, value in (attrs or {}).items():
        run.attrs[key] = value
    if waits_on:
        apply(run, {"run": run_id, "tenant": tenant, "at": at, "exec": 7, "type": "wait", "seq": 0,
                    "name": "|".join(waits_on), "channel": waits_on[0],
                    **({"channels": list(waits_on)} if len(waits_on) > 1 else {}), "due": 0.0})
        run.status = "suspended"
    flows.runs[run_id] = run
    return run


def broadcast(channel: str, message, **fields) -> Message:
    return Message("gateway/0", Kind.CHANNEL_BROADCAST, 1, 0.0, 0, "", "",
                   {"tenant": "t", "channel": channel, "message": message, **fields})


def answers(bus) -> list[dict]:
    return [body for _, kind, body in bus.sent if kind == Kind.CHANNEL_DELIVERED]


def took(log, run_id: str) -> list:
    return [r["result"] for r in log.appended if r["run"] == run_id and r["type"] == "op.done"]


def test_each_run_waiting_on_the_channel_takes_it_and_no_other_run_gets_it():
    async def main():
        flows, bus, log = flows_of_runs()
        add_run(flows, "a", waits_on=("deploy",))
        add_run(flows, "b", waits_on=("approve", "deploy"))
        add_run(flows, "c", waits_on=("other",))
        add_run(flows, "d", tenant="u", waits_on=("deploy",))   # another tenant's
        add_run(flows, "e", flow="turn", waits_on=("deploy",))  # the server's own flows are not the tenant's
        await flows.handlers()[Kind.CHANNEL_BROADCAST](broadcast("deploy", {"v": 2}))
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    assert answers(bus) == [{"ok": True, "delivered": 2}]
    assert took(log, "a") == [{"v": 2}] and took(log, "b") == [["deploy", {"v": 2}]]
    assert all(took(log, r) == [] for r in ("r-1", "c", "d", "e"))
    # nothing queued for a run that was not waiting: its next wait does not find it
    assert not any(flows.runs[r].channels.get("deploy") for r in ("r-1", "c", "d", "e"))
    assert flows.runs["a"].ops[0].done and not flows.runs["c"].ops[0].done


def test_a_flow_and_attribute_values_choose_the_runs():
    async def main():
        flows, bus, log = flows_of_runs()
        add_run(flows, "a", waits_on=("paid",), attrs={"invoice": 17, "region": "eu"})
        add_run(flows, "b", waits_on=("paid",), attrs={"invoice": 18, "region": "eu"})
        add_run(flows, "c", waits_on=("paid",), attrs={"region": "eu"})
        add_run(flows, "d", flow="billing", waits_on=("paid",), attrs={"invoice": 17, "region": "eu"})
        handle = flows.handlers()[Kind.CHANNEL_BROADCAST]
        await handle(broadcast("paid", "17 paid", flow="steps", where={"invoice": 17, "region": "eu"}))
        await handle(broadcast("paid", "none", where={"invoice": None}))   # an attribute never set is not None
        await handle(broadcast("paid", "to the eu", where={"region": "eu"}))
        return bus, log

    bus, log = asyncio.run(main())
    assert answers(bus) == [{"ok": True, "delivered": 1}, {"ok": True, "delivered": 0}, {"ok": True, "delivered": 3}]
    assert took(log, "a") == ["17 paid"] and took(log, "d") == ["to the eu"]
    assert took(log, "b") == took(log, "c") == ["to the eu"]


def test_under_a_key_a_run_takes_it_once_even_when_it_waits_again():
    async def main():
        flows, bus, log = flows_of_runs()
        a = add_run(flows, "a", waits_on=("tick",))
        handle = flows.handlers()[Kind.CHANNEL_BROADCAST]
        await handle(broadcast("tick", 1, key="k1"))
        apply(a, {"run": "a", "tenant": "t", "at": time.time(), "exec": 7, "type": "wait", "seq": 1, "name": "tick",
                  "channel": "tick", "due": 0.0})   # its next execution waits on the channel again
        add_run(flows, "b", waits_on=("tick",))     # and a run that was not waiting the first time now is
        await handle(broadcast("tick", 1, key="k1"))   # sent again: its answer was lost
        await handle(broadcast("tick", 2))
        return bus, log

    bus, log = asyncio.run(main())
    assert [a["delivered"] for a in answers(bus)] == [1, 1, 1]
    assert took(log, "a") == [1, 2] and took(log, "b") == [1]


class RefusingFor:
    """A log whose disk is full for one run's records."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.appended: list[dict] = []

    async def append(self, kind, body, session, sync=True):
        await asyncio.sleep(0.01)
        if body["run"] == self.run_id:
            raise LogWriteError("disk_full", "log write failed: No space left on device")
        self.appended.append(body)


def test_a_refused_record_is_said_with_the_runs_that_took_it_and_the_refused_one_waits_on():
    async def main():
        flows, bus, _ = flows_of_runs()
        flows.journal_log = log = RefusingFor("b")
        add_run(flows, "a", waits_on=("go",))
        b = add_run(flows, "b", waits_on=("go",))
        await flows.handlers()[Kind.CHANNEL_BROADCAST](broadcast("go", "now", key="k"))
        return bus, log, b

    bus, log, b = asyncio.run(main())
    [answer] = answers(bus)
    assert answer["ok"] is False and answer["code"] == "disk_full" and answer["delivered"] == 1
    assert took(log, "a") == ["now"]
    assert not b.ops[0].done and b.waiting == 0 and not b.channels.get("go") and "*go:k" not in b.message_keys


def test_a_broadcast_whose_caller_gave_up_is_not_done():
    async def main():
        flows, bus, log = flows_of_runs()
        add_run(flows, "a", waits_on=("go",))
        await flows.handlers()[Kind.CHANNEL_BROADCAST](broadcast("go", "late", deadline=time.time() - 5))
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    assert answers(bus) == [] and log.appended == [] and not flows.runs["a"].ops[0].done


def test_the_runs_waiting_on_a_channel_are_counted_and_listed_longest_waiting_first():
    async def main():
        flows, bus, log = flows_of_runs()
        for i, run_id in enumerate(("late", "early", "middle")):
            run = add_run(flows, run_id, waits_on=("approve", "paid") if i else ("paid",))
            run.ops[0].started_at = {"late": 30.0, "early": 10.0, "middle": 20.0}[run_id]
        add_run(flows, "other-flow", flow="billing", waits_on=("paid",))
        add_run(flows, "elsewhere", waits_on=("other",))
        ask = flows.handlers()[Kind.CHANNEL_WAITING]
        for fields in ({"limit": 2}, {"flow": "billing"}, {"limit": -3}):
            await ask(Message("gateway/0", Kind.CHANNEL_WAITING, 1, 0.0, 0, "", "",
                              {"tenant": "t", "channel": "paid", **fields}))
        return bus, log

    bus, log = asyncio.run(main())
    replies = [body for _, kind, body in bus.sent if kind == Kind.CHANNEL_WAITERS]
    assert replies[0] == {"count": 4, "runs": [{"run_id": "early", "flow": "steps", "since": 10.0},
                                               {"run_id": "middle", "flow": "steps", "since": 20.0}]}
    assert replies[1]["count"] == 1 and [r["run_id"] for r in replies[1]["runs"]] == ["other-flow"]
    assert replies[2] == {"count": 4, "runs": []}
    assert log.appended == []   # nothing woken, nothing written


def step_start_publish(seq: int, **fields) -> Message:
    return from_worker(Kind.STEP_START, seq + 1, seq=seq, op="publish", name="paid", channel="paid",
                       message={"n": seq}, **fields)


def test_a_flows_publish_asks_every_actor_under_its_run_and_place_and_journals_the_count(monkeypatch):
    monkeypatch.setattr(run_messages, "SEND_ATTEMPTS", 2)
    answers = {"actor/0": iter([{"ok": True, "delivered": 2}]),
               "actor/1": iter([BusError("timeout", "no answer"), {"ok": True, "delivered": 1}])}
    asked = []

    async def main():
        flows, bus, log, run = running_flows()
        flows.shards = 2

        async def request(dest, kind, body, **_):
            asked.append((dest, kind, body))
            answer = next(answers[dest])
            if isinstance(answer, Exception):
                raise answer
            return Message(dest, Kind.CHANNEL_DELIVERED, 1, time.time(), 0, "", "", answer)

        bus.request = request
        await flows.on_step_start(step_start_publish(0, flow="subscriber", where={"invoice": 17}))
        return bus, log

    bus, log = asyncio.run(main())
    assert sorted(dest for dest, _, _ in asked) == ["actor/0", "actor/1", "actor/1"]
    assert all(kind == Kind.CHANNEL_BROADCAST and body == {
        "tenant": "t", "channel": "paid", "message": {"n": 0}, "key": "r-1@0", "flow": "subscriber",
        "where": {"invoice": 17}} for _, kind, body in asked)
    assert [body for _, kind, body in bus.sent if kind == Kind.STEP_GO] == [
        {"action": "continue", "ok": True, "result": 3}]
    assert [(r["op"], r["seq"], r["result"]) for r in log.appended if r["type"] == "op.done"] == [("publish", 0, 3)]


def test_a_flows_publish_an_actor_never_answers_journals_nothing_and_ends_the_execution(monkeypatch):
    monkeypatch.setattr(run_messages, "SEND_ATTEMPTS", 2)

    async def main():
        flows, bus, log, run = running_flows()
        flows.shards = 2

        async def request(dest, kind, body, **_):
            if dest == "actor/1":
                raise BusError("timeout", "no answer")
            return Message(dest, Kind.CHANNEL_DELIVERED, 1, time.time(), 0, "", "", {"ok": True, "delivered": 1})

        bus.request = request
        await flows.on_step_start(step_start_publish(0))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert bus.sent[-1][1:] == (Kind.STEP_GO, {"action": "abort"}) and log.appended == [] and 0 not in run.ops


def test_the_sdk_checks_a_publish_and_a_replay_returns_the_recorded_count():
    recorded = [{"seq": 0, "op": "publish", "name": "paid", "ok": True, "result": 4}]

    async def flow(ctx):
        return await ctx.publish("paid", "x", where={"invoice": 1})

    runtime = Runtime({})
    assert asyncio.run(flow(FlowContext(runtime, "r-1", 1, None, recorded, {}))) == 4
    assert runtime.started == []   # replayed, nothing asked
    for bad in ({"channel": ""}, {"channel": "paid", "flow": ""}, {"channel": "paid", "where": {}},
                {"channel": "paid", "where": {1: 2}}, {"channel": "paid", "where": {str(i): i for i in range(21)}}):
        with pytest.raises(ValueError):
            asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).publish(**bad))
    with pytest.raises(TypeError):
        asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).publish("paid", object()))
