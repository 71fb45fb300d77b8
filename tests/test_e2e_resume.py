"""End-to-end: a client that lost its stream picks it up where it left off — after its own
disconnect, and after the gateway itself was killed mid-turn — receiving the rest exactly once."""
import asyncio

import aiohttp

from bench.mock_llm import expected_text
from harness import TurnResult, read_sse, wait_until

SLOW = "[[mock ttft_ms=300 tps=10 tokens=12]]"   # about 1.4 s of tokens


async def resume(session, base, sid, turn_id, last_id):
    async with session.get(f"{base}/v1/sessions/{sid}/turns/{turn_id}/events",
                           headers={"Last-Event-ID": str(last_id)}) as resp:
        result = TurnResult(resp.status, dict(resp.headers))
        if resp.status == 200:
            await read_sse(resp, result)
        return result


async def first_events(session, base, sid, n):
    """Read the first `n` events of a new turn, then drop the connection."""
    result = TurnResult(0, {})
    async with session.post(f"{base}/v1/sessions/{sid}/turns", json={"input": f"hello {SLOW}"}) as resp:
        result.status = resp.status

        class Enough(Exception):
            pass

        async def on_event(name, r):
            if len(r.events) >= n:
                raise Enough
        try:
            await read_sse(resp, result, on_event)
        except Enough:
            pass
    return result


def test_a_client_resumes_its_stream_after_a_disconnect(make_server):
    server = make_server({"kernel": {"disconnect_grace_secs": 5}})

    async def go():
        async with aiohttp.ClientSession() as s:
            head = await first_events(s, server.url, "resume-1", 3)
            turn_id = head.data("turn.started")["turn_id"]
            rest = await resume(s, server.url, "resume-1", turn_id, head.ids[-1])
            again = await resume(s, server.url, "resume-1", turn_id, 0)   # replay it all, after the end
            # every event already had, the terminal one too: nothing to wait for (it hung for good)
            done = await asyncio.wait_for(resume(s, server.url, "resume-1", turn_id, rest.ids[-1]), 10)
            return head, rest, again, done

    head, rest, again, done = asyncio.run(go())
    assert done.status == 204
    assert rest.status == 200 and rest.terminal == "turn.completed"
    assert rest.ids == list(range(head.ids[-1] + 1, head.ids[-1] + 1 + len(rest.ids)))   # no gap, no repeat
    assert head.text + rest.text == expected_text(12)
    assert again.ids == list(range(1, len(again.ids) + 1)) and again.text == expected_text(12)


def test_the_stream_survives_a_gateway_restart_mid_turn(make_server):
    server = make_server({"kernel": {"disconnect_grace_secs": 5}})

    async def go():
        async with aiohttp.ClientSession() as s:
            head = TurnResult(0, {})
            killed = False
            try:
                async with s.post(f"{server.url}/v1/sessions/resume-2/turns", json={"input": f"hi {SLOW}"}) as resp:
                    async def on_event(name, r):
                        nonlocal killed
                        if name == "delta" and not killed:
                            killed = True
                            await asyncio.get_running_loop().run_in_executor(None, server.kill9, "gateway/0")
                    await read_sse(resp, head, on_event)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            assert killed and head.terminal is None
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: wait_until(lambda: server.port and _ready(server.url), 20, "the new gateway"))
            turn_id = head.data("turn.started")["turn_id"]
            return head, await resume(s, server.url, "resume-2", turn_id, head.ids[-1])

    head, rest = asyncio.run(go())
    assert rest.status == 200 and rest.terminal == "turn.completed"
    assert rest.ids == list(range(head.ids[-1] + 1, head.ids[-1] + 1 + len(rest.ids)))   # the rest, exactly once
    assert head.text + rest.text == expected_text(12)


def _ready(url):
    import urllib.request
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
