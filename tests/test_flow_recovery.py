"""Recovering open runs after an actor start, with a fake store: what is adopted and what is not."""
import asyncio
import logging

from actors.flow_runs import Flows
from actors.flow_state import Run


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
