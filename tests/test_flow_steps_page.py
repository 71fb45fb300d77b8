"""A page of a run's operations (GET /v1/runs/{id}/steps) holds at most `limit` of them and,
past its first, about STEPS_PAGE_BYTES of their values: a run of big step results is read a few
at a time, not in one message of the whole journal. Times come from the journal, so a run read
back after a restart shows the same (unit, with the fakes of test_flow_results_due.py)."""
import asyncio
import time

from actors.flow_state import apply, replay
from broker.protocol import STEPS_PAGE_BYTES, Kind, Message
from test_flow_results_due import running_flows


def ask(flows, bus, after=-1, limit=100):
    body = {"run_id": "r-1", "tenant": "t", "after": after, "limit": limit}
    return Message("gateway/0#1", Kind.FLOW_STEPS, 1, time.time(), 0, "r-1", "", body)


def test_a_page_of_big_results_holds_what_fits_and_names_the_next():
    big = "x" * (STEPS_PAGE_BYTES // 3)

    async def main():
        flows, bus, _, run = running_flows()
        for seq in range(7):
            apply(run, {"run": "r-1", "type": "step.started", "seq": seq, "name": f"s{seq}", "attempt": 1,
                        "at": 1000.0 + seq})
            apply(run, {"run": "r-1", "type": "step.done", "seq": seq, "name": f"s{seq}", "ok": True,
                        "result": big if seq % 2 else seq, "at": 1000.5 + seq})
        pages, after = [], -1
        while True:
            await flows.handlers()[Kind.FLOW_STEPS](ask(flows, bus, after))
            _, kind, body = bus.sent[-1]
            assert kind == Kind.FLOW_OPS and body["found"]
            pages.append([op["seq"] for op in body["ops"]])
            if "next_after" not in body:
                break
            after = body["next_after"]
        # three big results do not fit one page; the small ones ride along
        assert pages == [[0, 1, 2, 3, 4], [5, 6]]
        await flows.handlers()[Kind.FLOW_STEPS](ask(flows, bus, -1, limit=2))
        assert [op["seq"] for op in bus.sent[-1][2]["ops"]] == [0, 1] and bus.sent[-1][2]["next_after"] == 1
        first = bus.sent[-1][2]["ops"][0]
        assert first == {"seq": 0, "op": "step", "name": "s0", "status": "completed", "started_at": 1000.0,
                         "ended_at": 1000.5, "attempts": 1, "result": 0}

        async def no_journal(what, run_id, sync=False):   # writer/store: no such run
            return {"rows": []}
        flows.query = no_journal
        await flows.handlers()[Kind.FLOW_STEPS](Message("gateway/0#1", Kind.FLOW_STEPS, 2, time.time(), 0, "r-9", "",
                                                        {"run_id": "r-9", "tenant": "t"}))
        assert bus.sent[-1][1:] == (Kind.FLOW_OPS, {"found": False, "code": "not_found", "error": "no such run"})

    asyncio.run(main())


def test_an_operations_times_and_state_are_the_journals_read_back_or_live():
    records = [{"run": "r", "tenant": "t", "type": "run.started", "flow": "f", "at": 10.0, "exec": 1},
               {"run": "r", "tenant": "t", "type": "step.started", "seq": 0, "name": "a", "attempt": 1, "at": 11.0},
               {"run": "r", "tenant": "t", "type": "step.failed", "seq": 0, "attempt": 1, "error": "nope", "at": 12.0},
               {"run": "r", "tenant": "t", "type": "step.started", "seq": 0, "name": "a", "attempt": 2, "at": 13.0},
               {"run": "r", "tenant": "t", "type": "wait", "seq": 1, "name": "w", "channel": "inbox", "due": 0,
                "at": 14.0}]
    run = replay("r", records)
    step, wait = run.ops[0].view(run.ended), run.ops[1].view(run.ended)
    assert step == {"seq": 0, "op": "step", "name": "a", "status": "running", "started_at": 11.0, "ended_at": None,
                    "attempts": 2, "error": "nope"}     # its last failed attempt, while it is retried
    assert wait == {"seq": 1, "op": "wait", "name": "w", "status": "waiting", "started_at": 14.0, "ended_at": None,
                    "channel": "inbox"}
    apply(run, {"run": "r", "tenant": "t", "type": "run.ended", "status": "cancelled", "at": 15.0})
    assert [op.view(run.ended)["status"] for op in run.ops.values()] == ["abandoned", "abandoned"]
    assert run.summary()["started_at"] == 10.0 and run.summary()["ended_at"] == 15.0


def test_a_peers_ask_with_its_optional_fields_null_is_answered_from_the_first():
    async def main():
        flows, bus, _, run = running_flows()
        apply(run, {"run": "r-1", "type": "step.started", "seq": 0, "name": "a", "attempt": 1, "at": 1.0})
        await flows.handlers()[Kind.FLOW_STEPS](Message("gateway/0#1", Kind.FLOW_STEPS, 1, time.time(), 0, "r-1", "",
                                                        {"run_id": "r-1", "tenant": "t", "after": None,
                                                         "limit": None}))
        assert [op["seq"] for op in bus.sent[-1][2]["ops"]] == [0]

    asyncio.run(main())
