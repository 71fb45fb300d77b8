"""End-to-end: with `provider.max_context_chars`, a long session's model calls are sent its newest
messages that fit (each step's event says how many), not its whole history, while the transcript
keeps everything; `provider.system_prompt` goes first in every call (a turn's own `system` in its
place) and never into the transcript."""
import asyncio

import aiohttp

from harness import get_json, turn

BUDGET = 600


def test_a_long_sessions_model_calls_are_sent_only_the_newest_messages_that_fit(make_server):
    server = make_server({"provider": {"max_context_chars": BUDGET}})
    base = server.url
    for n in range(8):
        assert turn(base, "long", f"question {n}: " + "x" * 100).terminal == "turn.completed"
    transcript = get_json(f"{base}/v1/sessions/long/messages?limit=1000")[2]["messages"]
    assert [m["role"] for m in transcript] == ["user", "assistant"] * 8   # all of it kept
    events = get_json(f"{base}/v1/sessions/long/events?limit=1000")[2]["events"]
    steps = [e["data"] for e in events if e["type"] == "step.completed" and e["data"]["kind"] == "model"]
    sent = [s["messages_sent"] for s in steps]
    assert len(sent) == 8 and sent[:2] == [1, 3]          # while all of it fits, all of it goes
    assert 1 < sent[-1] < 15 and max(sent) < 15           # then only the newest that fit
    assert sent[-1] % 2 == 1                              # from a user message: whole exchanges
    assert steps[-1]["prompt_tokens"] <= BUDGET // 4      # the mock counts what it was sent


def test_the_system_prompt_goes_to_every_model_call_and_not_into_the_transcript(make_server):
    prompt = "You answer in one short sentence. " * 12          # 408 characters
    server = make_server({"provider": {"system_prompt": prompt, "max_context_chars": 300}})
    base = server.url
    for text in ("hi", "again"):
        assert turn(base, "told", text).terminal == "turn.completed"
    events = get_json(f"{base}/v1/sessions/told/events?limit=1000")[2]["events"]
    steps = [e["data"] for e in events if e["type"] == "step.completed" and e["data"]["kind"] == "model"]
    # the mock counts a token per four characters of every message it was sent: the prompt's are there
    assert [s["prompt_tokens"] >= len(prompt) // 4 for s in steps] == [True, True]
    assert [s["messages_sent"] for s in steps] == [1, 3]            # the prompt (408 > 300) is not counted
    transcript = get_json(f"{base}/v1/sessions/told/messages")[2]["messages"]
    assert [m["role"] for m in transcript] == ["user", "assistant", "user", "assistant"]

    # A turn's own instructions take the server's place for that turn.
    async def told(body):
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/sessions/told/turns", json=body) as resp:
                return resp.status, await resp.text()
    status, stream = asyncio.run(told({"input": "once more", "system": "Be terse."}))
    assert status == 200 and "event: turn.completed" in stream
    events = get_json(f"{base}/v1/sessions/told/events?limit=1000")[2]["events"]
    last = [e["data"] for e in events if e["type"] == "step.completed" and e["data"]["kind"] == "model"][-1]
    assert last["prompt_tokens"] < len(prompt) // 4
    for bad, code in (({"input": "x", "system": 7}, 400), ({"input": "x", "system": "y" * 200_000}, 413)):
        assert asyncio.run(told(bad))[0] == code
