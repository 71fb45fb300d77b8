"""`ctx.emit` and its readers (FLOW_STEPS `only: emit` with `wait`), with fakes for the bus and the
log (end to end: test_e2e_run_emitted.py)."""
import asyncio
import time

import pytest

from actors.flow_context import FlowContext
from actors.flow_state import apply
from broker.protocol import Kind, Message
from test_flow_patches import Runtime
from test_flow_results_due import from_worker, running_flows


def read(after=-1, wait=0.0, only="emit") -> Message:
    return Message("gateway/0", Kind.FLOW_STEPS, 1, 0.0, 0, "r-1", "",
                   {"run_id": "r-1", "tenant": "t", "after": after, "only": only, "wait": wait})


def pages(bus) -> list[dict]:
    return [body for _, kind, body in bus.sent if kind == Kind.FLOW_OPS]


def test_an_emit_is_journaled_as_its_op_and_wakes_a_reader_waiting_for_one():
    async def main():
        flows, bus, log, run = running_flows()
        await flows.on_step_start(from_worker(Kind.STEP_START, 1, seq=0, op="attr_set", name="k", key="k", value=1))
        reader = asyncio.ensure_future(flows.on_steps(read(wait=30)))
        await asyncio.sleep(0.05)
        assert not reader.done()   # the attribute write is no emitted value
        began = time.monotonic()
        await flows.on_step_start(from_worker(Kind.STEP_START, 2, seq=1, op="emit", name="emit", value={"pct": 40}))
        await asyncio.wait_for(reader, 2.0)
        return bus, log, time.monotonic() - began

    bus, log, took = asyncio.run(main())
    assert [(r["op"], r["seq"], r.get("result")) for r in log.appended if r["type"] == "op.done"][-1] == (
        "emit", 1, {"pct": 40})
    [page] = pages(bus)
    assert [(op["seq"], op["op"], op["result"]) for op in page["ops"]] == [(1, "emit", {"pct": 40})]
    assert page["status"] == "running" and took < 1.0
    assert [body for _, kind, body in bus.sent if kind == Kind.STEP_GO][-1] == {"action": "continue"}


def test_a_reader_waiting_for_a_value_hears_of_the_runs_end_at_once():
    async def main():
        flows, bus, log, run = running_flows()
        reader = asyncio.ensure_future(flows.on_steps(read(wait=30)))
        await asyncio.sleep(0.05)
        await flows.end(run, "completed", result="done")
        await asyncio.wait_for(reader, 2.0)
        await flows.on_steps(read(wait=30))   # an ended run: answered at once
        return bus

    bus = asyncio.run(main())
    assert [(p["ops"], p["status"]) for p in pages(bus)] == [([], "completed"), ([], "completed")]


def test_the_sdk_emits_json_values_once_and_a_replay_emits_nothing():
    recorded = [{"seq": 0, "op": "emit", "name": "emit", "ok": True, "result": {"step": 0}}]

    async def flow(ctx):
        await ctx.emit({"step": 0})
        await ctx.emit({"step": 1})

    runtime = Runtime({})
    asyncio.run(flow(FlowContext(runtime, "r-1", 1, None, recorded, {})))
    assert [(s["seq"], s["op"], s["value"]) for s in runtime.started] == [(1, "emit", {"step": 1})]
    with pytest.raises(TypeError, match="JSON"):
        asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).emit(b"bytes"))


def test_a_replayed_run_keeps_its_emitted_values_at_their_places():
    from actors.flow_state import Run
    run = Run("r-1", "steps", "t")
    for record in ({"type": "run.started", "flow": "steps", "exec": 1, "input": {}},
                   {"type": "op.done", "seq": 0, "op": "emit", "name": "emit", "ok": True, "result": 1, "at": 5.0}):
        apply(run, {"run": "r-1", "tenant": "t", "at": 5.0, **record})
    assert run.ops[0].op == "emit" and run.ops[0].result == 1 and run.journal()[0]["result"] == 1
