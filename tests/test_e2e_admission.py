"""End-to-end: the admission gate answers 429 at once, touches no session, and loses nothing."""
import asyncio

import aiohttp

from harness import run_turn, scrape, wait_until


def test_429_above_the_limit_and_a_rejected_turn_does_not_cancel_its_session(make_server):
    server = make_server({"kernel": {"max_in_flight_turns": 2, "concurrency_limit": 64},
                          "gateway": {"retry_after_secs": 2}})

    async def go():
        started = {"a": asyncio.Event(), "b": asyncio.Event()}

        def watcher(key):
            async def on_event(name, result):
                if name == "turn.started":
                    started[key].set()
            return on_event

        async with aiohttp.ClientSession() as s:
            a = asyncio.create_task(run_turn(s, server.url, "adm-a", "slow [[mock ttft_ms=4000]]", on_event=watcher("a")))
            b = asyncio.create_task(run_turn(s, server.url, "adm-b", "slow [[mock ttft_ms=4000]]", on_event=watcher("b")))
            await asyncio.wait_for(asyncio.gather(started["a"].wait(), started["b"].wait()), 10)
            other = await run_turn(s, server.url, "adm-c", "rejected")
            same_session = await run_turn(s, server.url, "adm-a", "rejected, must not cancel a")
            return await a, await b, other, same_session

    a, b, other, same_session = asyncio.run(go())
    for rejected in (other, same_session):
        assert rejected.status == 429
        assert rejected.headers["Retry-After"] == "2"
        assert rejected.error["code"] == "overloaded" and rejected.error["message"]
    assert a.terminal == "turn.completed" and b.terminal == "turn.completed"
    # Metrics are flushed to Prometheus about once a second: wait for the counts to land.
    values = wait_until(lambda: (v := scrape(server.url))["agentos_admission_rejected_total"] == 2 and
                        v["agentos_in_flight_turns"] == 0 and v, 10, "the metrics to settle")
    assert values["agentos_admission_limit"] == 2
    assert values["agentos_in_flight_turns"] == 0
    assert values.get('agentos_turns_total{outcome="cancelled"}', 0) == 0
