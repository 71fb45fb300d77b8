"""Recovering open runs after an actor start, with a fake store: what is adopted and what is not."""
import asyncio
import logging
import time

import pytest

from actors.flow_runs import Flows
from actors.flow_state import Run, apply
from broker.protocol import Kind, Message
from storage.log_client import LogWriteError


def _records(run_id: str, flow: str) -> list[dict]:
    return [{"run": run_id, "tenant": "t", "type": "run.started", "flow": flow, "exec": 0, "at": 0.0,
             "input": {"session": "s", "turn": run_id.split("/")[1], "input": "hi"}}]


def test_a_run_begun_while_the_open_runs_query_was_in_flight_is_not_adopted_twice():
    adopted: list[str] = []

    async def main() -> Flows:
        flows = Flows(bus=None, log=None, query=None, index=0, shards=1, logger=logging.getLogger("t"))
        live = Run("s/live", "turn", "t")

        async def query(name: str, session: str, **params) -> dict:
            if name == "open_runs":
                flows.runs[live.run_id] = live   # a turn starts on this actor meanwhile
                return {"rows": [{"run_id": "s/live"}, {"run_id": "s/old"}]}
            return {"rows": _records(session, "turn")}

        flows.query = query
        flows.on_open_turn = lambda run: adopted.append(run.run_id)
        await flows.load()
        assert flows.runs["s/live"] is live
        return flows

    flows = asyncio.run(main())
    assert adopted == ["s/old"] and flows.ready.is_set()


def test_a_recovered_run_waiting_with_a_message_queued_takes_it_and_runs_again():
    """The actor died between a wait's record and its taking of a message published before it:
    after the restart the run takes that message at once, not at the next publish."""
    from test_flow_cancel import FakeBus

    class Log:
        def __init__(self) -> None:
            self.appended: list[dict] = []

        async def append(self, kind, body, session, sync=True):
            self.appended.append(body)
            return len(self.appended)

    journal = [{"type": "run.started", "flow": "waiter", "exec": 5, "input": {}},
               {"type": "message", "channel": "inbox", "msg_seq": 1, "message": "early"},
               {"type": "wait", "seq": 0, "name": "wait", "channel": "inbox", "due": 0.0}]

    async def main() -> tuple[Flows, FakeBus, Log]:
        bus, log = FakeBus(), Log()
        flows = await restarted(bus, log, "w-1", journal)
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    run = flows.runs["w-1"]
    assert [(r["type"], r.get("msg_seq")) for r in log.appended] == [("message.taken", 1), ("op.done", None)]
    assert run.ops[0].done and run.ops[0].result == "early" and run.waiting is None
    assert [kind for _, kind, _ in bus.sent][-1] == Kind.TASK_SUBMIT   # executed again, past its wait


async def restarted(bus, log, run_id: str, journal: list[dict]) -> Flows:
    """An actor's flows after a restart (a new incarnation of `bus`), the store answering one open
    run with this journal; loaded, and what loading spawned given its turns."""
    bus.incarnation = 2
    flows = Flows(bus=bus, log=log, query=None, index=0, shards=1, logger=logging.getLogger("t"))

    async def query(name: str, session: str, **params) -> dict:
        if name == "open_runs":
            return {"rows": [{"run_id": run_id}]}
        return {"rows": [{"run": run_id, "tenant": "t", "at": 0.0, **record} for record in journal]}

    flows.query = query
    await flows.load()
    for _ in range(20):
        await asyncio.sleep(0)
    return flows


def live_run(journal: list[dict], log=None):
    """An actor's flows (a fake bus, the store answering `journal` for run r-1) holding r-1 as
    that journal has it; `loads` lists the store's reads of it."""
    from test_flow_cancel import FakeBus

    bus = FakeBus()
    bus.incarnation = 2
    flows = Flows(bus=bus, log=log, query=None, index=0, shards=1, logger=logging.getLogger("t"))
    loads: list[str] = []

    async def query(name: str, session: str, **params) -> dict:
        loads.append(session)
        return {"rows": [{"run": "r-1", "tenant": "t", "at": 0.0, **record} for record in journal]}

    flows.query = query
    flows.ready.set()
    run = Run("r-1", "steps", "t")
    for record in journal:
        apply(run, {"run": "r-1", "tenant": "t", "at": 0.0, **record})
    flows.runs["r-1"] = run
    return flows, bus, run, loads


def test_a_refused_step_result_sends_the_run_back_to_its_journal(monkeypatch):
    """What the worker reported is not kept in memory: the run comes back from its journal (once,
    though asked for meanwhile), runs again from there, and its old object records nothing more."""
    from actors import run_reloads
    from actors.run_reloads import Stale

    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}},
               {"type": "step.started", "seq": 0, "name": "a", "attempt": 1}]

    class FullLog:
        async def append(self, kind, body, session, sync=True):
            raise LogWriteError("disk_full", "log write failed: No space left on device")

    async def main():
        flows, bus, run, loads = live_run(journal, FullLog())
        result = Message("worker/0", Kind.STEP_RESULT, 7, 0.0, 0, "r-1", "",
                         {"run_id": "r-1", "exec": run.exec, "seq": 0, "attempt": 1, "ok": True, "result": 42})
        monkeypatch.setattr(run_reloads, "RELOAD_RETRY_SECS", (0.01, 0.01))
        await flows.handlers()[Kind.STEP_RESULT](result)
        assert bus.sent == [("worker/0", Kind.FLOW_ACK, {"ok": False, "code": "superseded"})]   # at once
        assert run.stale and "r-1" not in flows.runs
        found = await flows.find("r-1", "t")          # waits for the reload rather than loading twice
        assert found is flows.runs["r-1"] and found is not run and loads == ["r-1"]
        assert not found.ops[0].done                  # the refused result is not there
        assert [kind for _, kind, _ in bus.sent][-1] == Kind.TASK_SUBMIT and found.exec > run.exec
        try:
            await flows.record(run, "step.done", seq=0, name="a", ok=True, result=1)
        except Stale:
            pass
        else:
            raise AssertionError("the old object recorded")

    asyncio.run(main())


def test_a_run_coming_back_from_its_journal_is_read_from_the_journal_at_once(monkeypatch):
    """Its reload waits while the disk stays full; a read of it does not wait with it."""
    from actors import run_reloads

    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}},
               {"type": "attr.set", "key": "status", "value": "durable", "seq": -1},
               {"type": "wait", "seq": 0, "name": "wait", "channel": "inbox", "due": 0.0}]

    async def main():
        flows, bus, run, _ = live_run(journal)
        apply(run, {"run": "r-1", "tenant": "t", "at": 0.0, "type": "attr.set", "key": "status", "value": "refused",
                    "seq": -1})
        monkeypatch.setattr(run_reloads, "RELOAD_RETRY_SECS", (30.0, 30.0))   # the disk stays full
        flows.reload("r-1", LogWriteError("disk_full", "log write failed: No space left on device"))
        for kind, body, handler in ((Kind.FLOW_GET, {"run_id": "r-1", "tenant": "t", "wait": 5}, flows.on_get),
                                    (Kind.ATTR_GET, {"run_id": "r-1", "tenant": "t"}, flows.on_attr_get)):
            await asyncio.wait_for(handler(Message("gateway/0", kind, 1, 0.0, 0, "r-1", "", body)), 1.0)
        (_, _, status), (_, _, attrs) = bus.sent
        assert status["status"] == "suspended" and attrs["values"] == {"status": "durable"}
        assert "r-1" in flows.reloading and "r-1" not in flows.runs
        for task in bus.tasks:
            task.cancel()

    asyncio.run(main())


WRITES = {   # a request that writes to a run, and what its refusal looks like in the reply
    "publish": (Kind.CHANNEL_PUBLISH, {"channel": "inbox", "message": "hi"}, "on_publish", {"ok": False}),
    "update": (Kind.ATTR_UPDATE, {"key": "n", "handler": "add"}, "on_attr_update", {"found": True}),
    "cancel": (Kind.FLOW_CANCEL, {}, "on_cancel", {"status": "error"}),
    "start": (Kind.FLOW_START, {"flow": "steps", "input": {}}, "on_start", {"status": "error"}),
}


class AcceptingLog:
    def __init__(self) -> None:
        self.appended: list[dict] = []

    async def append(self, kind, body, session, sync=True):
        self.appended.append(body)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_to_a_run_coming_back_while_the_disk_stays_full_hears_the_refusal(monkeypatch, write):
    """It once waited for the reload, which waits on what the old run appended: while the disk
    stayed full, until the caller's own timeout."""
    from actors import run_reloads

    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}},
               {"type": "wait", "seq": 0, "name": "wait", "channel": "inbox", "due": 0.0}]
    kind, fields, handler, refused = WRITES[write]

    async def main():
        flows, bus, run, loads = live_run(journal, AcceptingLog())
        run.pending.add(asyncio.get_running_loop().create_future())   # a record the full disk keeps refusing
        monkeypatch.setattr(run_reloads, "WRITE_WAIT_SECS", 0.2)
        flows.reload("r-1", LogWriteError("disk_full", "log write failed: No space left on device"))
        began = time.monotonic()
        msg = Message("gateway/0", kind, 1, 0.0, 0, "r-1", "", {"run_id": "r-1", "tenant": "t", **fields})
        await asyncio.wait_for(getattr(flows, handler)(msg), 2.0)
        (_, _, reply), = bus.sent
        assert time.monotonic() - began < 1.0
        assert reply["code"] == "disk_full" and "No space left" in reply["error"], reply
        assert {k: reply[k] for k in refused} == refused
        assert "r-1" in flows.reloading and loads == [] and flows.journal_log.appended == []
        for task in bus.tasks:
            task.cancel()

    asyncio.run(main())


def test_a_write_to_a_run_coming_back_loads_it_now_rather_than_after_the_backoff(monkeypatch):
    """Space has come back: the write's own record says so, so it need not wait out the backoff."""
    from actors import run_reloads

    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}},
               {"type": "wait", "seq": 0, "name": "wait", "channel": "other", "due": 0.0}]

    async def main():
        flows, bus, run, loads = live_run(journal, AcceptingLog())
        monkeypatch.setattr(run_reloads, "RELOAD_RETRY_SECS", (30.0, 30.0))
        flows.reload("r-1", LogWriteError("disk_full", "log write failed: No space left on device"))
        msg = Message("gateway/0", Kind.CHANNEL_PUBLISH, 1, 0.0, 0, "r-1", "",
                      {"run_id": "r-1", "tenant": "t", "channel": "inbox", "message": "hi"})
        await asyncio.wait_for(flows.on_publish(msg), 2.0)
        assert bus.sent[-1] == ("gateway/0", Kind.FLOW_ACK, {"ok": True})
        assert loads == ["r-1"] and "r-1" not in flows.reloading
        back = flows.runs["r-1"]
        assert back is not run and list(back.channels["inbox"])[0][1] == "hi"
        assert [r["type"] for r in flows.journal_log.appended] == ["message"]

    asyncio.run(main())


@pytest.mark.parametrize("parent_status", ["running", "suspended", "completed", "failed", "unknown", "cancelled"])
def test_a_recovered_child_is_cancelled_only_if_its_parent_has_ended(parent_status):
    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}, "parent": "p-1", "parent_seq": 0,
                "parent_actor": "actor/1"},
               {"type": "sleep", "seq": 0, "name": "sleep", "due": time.time() + 3600}]

    async def main():
        flows, bus, run, _ = live_run(journal, AcceptingLog())
        asked = []

        async def request(dest, kind, body, **_):
            asked.append((dest, kind, body))
            return Message(dest, Kind.FLOW_RUN, 1, 0.0, 0, "p-1", "", {"run_id": "p-1", "status": parent_status})

        bus.request = request
        await flows.follow_parent(run)
        assert asked == [("actor/1", Kind.FLOW_GET, {"run_id": "p-1", "tenant": "t"})]
        return run, flows.journal_log.appended

    run, appended = asyncio.run(main())
    if parent_status in ("completed", "failed", "cancelled"):   # nobody is left to take its result
        assert run.status == "cancelled" and "p-1" in run.error
        assert [(r["type"], r["status"]) for r in appended] == [("run.ended", "cancelled")]
    else:
        assert not run.ended and appended == []


def test_a_request_for_a_run_the_store_cannot_read_back_is_answered_unavailable_at_once(caplog):
    """writer/store down (restarting, stalled): a caller's request for a run not in memory died in
    its handler ("handler failed", a traceback) and was never answered, so the gateway waited out
    its own timeout. Now the caller hears `unavailable` (503) at once, and the log says it in a
    WARNING."""
    from actors.persistence import StorageUnavailable
    from test_flow_cancel import FakeBus

    async def main() -> FakeBus:
        bus = FakeBus()
        flows = Flows(bus=bus, log=None, query=None, index=0, shards=1, logger=logging.getLogger("t.store-away"))

        async def query(name: str, session: str, **params) -> dict:
            raise StorageUnavailable("the store did not answer: writer/store: unknown within 30s")

        flows.query = query
        flows.ready.set()
        handlers = flows.handlers()
        asked = {"run_id": "r-away", "tenant": "t"}
        for kind, body in ((Kind.FLOW_START, {**asked, "flow": "f", "input": None}), (Kind.FLOW_GET, asked),
                           (Kind.FLOW_CANCEL, asked), (Kind.CHANNEL_PUBLISH, {**asked, "channel": "c", "message": 1}),
                           (Kind.ATTR_GET, asked), (Kind.ATTR_UPDATE, {**asked, "key": "k", "handler": "h", "arg": 1})):
            await handlers[kind](Message("gateway/0", kind, 1, 0.0, 0, "r-away", "", body))
        return bus

    with caplog.at_level(logging.WARNING, logger="t.store-away"):
        bus = asyncio.run(main())
    assert [(kind, body.get("code")) for _, kind, body in bus.sent] == \
        [(Kind.FLOW_RUN, "unavailable")] * 3 + [(Kind.FLOW_ACK, "unavailable")] + \
        [(Kind.ATTR_VALUES, "unavailable")] * 2
    assert "writer/store: unknown within 30s" in bus.sent[0][2]["error"]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]   # once: the rest are counted
