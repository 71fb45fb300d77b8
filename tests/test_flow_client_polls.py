"""A long poll through the flow client (actors/flow_client.py): its attempts last longer, so it
is sent again less often meanwhile (a re-sent read is run again: each copy waited in the actor
beside the first, a GET ?wait=60 twelve of them; now three), and a follower's wait of 15 s not
at all."""
import asyncio

from actors.flow_client import FlowClient
from broker.protocol import Kind, Message


class Bus:
    def __init__(self) -> None:
        self.asked: list[tuple[Kind, float, float]] = []

    async def request(self, dest, kind, body, timeout, attempt_secs, session=""):
        self.asked.append((kind, timeout, attempt_secs))
        answer = {"run_id": "r-1", "status": "running"} if kind == Kind.FLOW_GET else {"found": True, "ops": []}
        return Message(dest, kind, 1, 0.0, 0, "", "", answer)


def test_a_long_polls_attempts_outlast_its_wait_and_a_plain_read_keeps_its_short_ones():
    bus = Bus()
    client = FlowClient(bus, 2)

    async def main():
        await client.get("r-1", wait=60)
        await client.emitted("r-1", wait=15.0)
        await client.get("r-1")

    asyncio.run(main())
    (_, get_timeout, get_attempt), (_, emit_timeout, emit_attempt), (_, _, plain_attempt) = bus.asked
    assert get_attempt == 20.0 and get_timeout > 60   # (not longer: an attempt is also how a lost one is sent again)
    assert emit_attempt == 20.0 and emit_timeout > 15
    assert plain_attempt == 5.0
