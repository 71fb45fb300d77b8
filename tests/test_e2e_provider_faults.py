"""End-to-end: every way the provider can fail ends the turn with `turn.failed` naming the cause,
within `provider.timeout_secs`; permits come back; a 429 pauses grants without failing the
other tenants' turns."""
import asyncio
import time

import aiohttp
import pytest

from harness import get_json, run_turn, turn, wait_until

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    from harness import Server
    server = Server(tmp_path_factory.mktemp("faults"), {
        "provider": {"timeout_secs": TIMEOUT, "max_retries": 1},
        "kernel": {"concurrency_limit": 2},
        "auth": {"api_keys": {"key-a": "acme", "key-b": "globex"}}}).start()
    yield server
    server.stop()
    assert not server.leftovers()


@pytest.mark.parametrize("marker,code,limit", [
    ("error=500", "server_error", 5.0),
    ("error=disconnect", "disconnect", 5.0),
    ("error=slow ttft_ms=400", "timeout", TIMEOUT + 2.0),    # first token after 4 s
    ("error=hang", "timeout", TIMEOUT + 2.0),                 # a stream that never ends
    ("error=429", "rate_limited", 6.0),
])
def test_each_provider_fault_ends_the_turn_with_its_cause(faulty, marker, code, limit):
    started = time.monotonic()
    result = turn(faulty.url, f"pf-{code}", f"x [[mock {marker}]]", headers={"Authorization": "Bearer key-a"})
    took = time.monotonic() - started
    assert result.terminal == "turn.failed", result.events[-2:]
    error = result.data("turn.failed")["error"]
    assert error["code"] == code and error["message"]
    assert took < limit, took
    # The provider stream is closed and the permit is back.
    wait_until(lambda: get_json(f"{faulty.mock_url}/stats")[2]["current"] == 0, 10, "the mock's streams to close")

    def permits_back():
        rows = faulty.status()["processes"]
        scheduler = next(r for r in rows if r["name"] == "scheduler")["stats"]
        return scheduler["held"] == 0 and scheduler["waiting"] == 0
    wait_until(permits_back, 10, "every permit to be released", interval=0.2)


def test_a_429_pauses_grants_without_failing_other_tenants(faulty):
    async def go():
        async with aiohttp.ClientSession() as s:
            limited = asyncio.create_task(run_turn(s, faulty.url, "pf-429b", "x [[mock error=429]]",
                                                   headers={"Authorization": "Bearer key-a"}))
            await asyncio.sleep(0.3)
            others = [asyncio.create_task(run_turn(s, faulty.url, f"pf-other-{i}", "hello",
                                                   headers={"Authorization": "Bearer key-b"})) for i in range(3)]
            return await limited, await asyncio.gather(*others)

    limited, others = asyncio.run(go())
    assert limited.terminal == "turn.failed" and limited.data("turn.failed")["error"]["code"] == "rate_limited"
    assert [o.terminal for o in others] == ["turn.completed"] * 3   # they waited out the back-off, none failed
    values = __import__("harness").scrape(faulty.url)
    assert values["agentos_provider_backoffs_total"] >= 1
