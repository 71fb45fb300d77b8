"""End-to-end: a turn started with an `Idempotency-Key` is one turn however often its start is
sent. A start sent again after the client's connection broke streams that turn from its first
event to its end (the turn was not cancelled, nor begun twice); sent again after it ended, its
whole stream again while the actor keeps it, then 409 `turn_exists`; the key with another input
is a 409 `conflict`; the transcript holds the exchange once."""
import asyncio

import aiohttp
import pytest

from harness import get_json, run_turn, turn, wait_until

KEY = {"Idempotency-Key": "message-1"}
TEXT = "hello [[mock ttft_ms=1500]]"


def test_a_keyed_start_sent_again_streams_the_one_turn_it_began(make_server):
    server = make_server({"kernel": {"disconnect_grace_secs": 10, "turn_retention_secs": 2}})
    base, sid = server.url, "keyed-1"

    async def dropped_then_again():
        async with aiohttp.ClientSession() as http:
            with pytest.raises(asyncio.TimeoutError):   # the connection breaks before the answer
                await run_turn(http, base, sid, TEXT, headers=KEY, timeout=0.5)
            return await run_turn(http, base, sid, TEXT, headers=KEY)

    again = asyncio.run(dropped_then_again())
    assert again.terminal == "turn.completed", again.events[-2:]
    assert again.ids == list(range(1, len(again.ids) + 1))            # from its first event, none twice
    turn_id = again.data("turn.started")["turn_id"]
    assert turn_id.startswith("k") and again.text

    replayed = turn(base, sid, TEXT, headers=KEY)                      # ended, still kept: the same stream
    assert replayed.data("turn.started")["turn_id"] == turn_id and replayed.text == again.text
    assert replayed.ids == again.ids and replayed.terminal == "turn.completed"
    other = turn(base, sid, "something else", headers=KEY)
    assert other.status == 409 and other.error["code"] == "conflict"

    def refused():   # once the actor has let the ended turn go, its journal still says it ran
        result = turn(base, sid, TEXT, headers=KEY)
        return result if result.status == 409 else None
    late = wait_until(refused, 20, "a keyed start of a turn past its retention to be refused", interval=0.5)
    assert late.error["code"] == "turn_exists", late.error

    fresh = turn(base, sid, "and now? [[mock ttft_ms=10]]", headers={"Idempotency-Key": "message-2"})
    assert fresh.terminal == "turn.completed" and fresh.data("turn.started")["turn_id"] != turn_id
    messages = get_json(f"{base}/v1/sessions/{sid}/messages")[2]["messages"]
    assert [(m["role"], m["turn_id"] == turn_id) for m in messages] == [
        ("user", True), ("assistant", True), ("user", False), ("assistant", False)]
    assert turn(base, sid, "x", headers={"Idempotency-Key": ""}).status == 400
