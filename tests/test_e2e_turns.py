"""End-to-end: turns through the real process tree (supervisor, broker, gateway, scheduler,
two actors, the bundled mock model), asserting on what a client receives."""
import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from agentos.config import BrokerConfig
from bench.mock_llm import expected_text
from broker.sharding import actor_name
from harness import REPO, get_json, run_turn, scrape, start_turn, turn, wait_until


def test_a_turn_streams_and_the_session_keeps_its_history(shared_server):
    first = turn(shared_server.url, "e2e-stream", "hello there")
    assert first.status == 200
    assert first.headers["Content-Type"].startswith("text/event-stream")
    names = [e for e, _ in first.events]
    assert names[0] == "turn.started" and names[-1] == "turn.completed"
    assert set(names[1:-1]) == {"delta"}
    assert first.text == expected_text(5)
    assert first.ids == list(range(1, len(first.events) + 1))
    assert first.data("turn.started")["session_id"] == "e2e-stream"
    done = first.data("turn.completed")
    assert done["usage"]["completion_tokens"] == 5
    assert 0 < done["durations"]["ttft_ms"] <= done["durations"]["total_ms"]
    second = turn(shared_server.url, "e2e-stream", "and again")
    assert second.terminal == "turn.completed"
    # The model saw the whole conversation the second time: more prompt tokens.
    assert second.data("turn.completed")["usage"]["prompt_tokens"] > done["usage"]["prompt_tokens"]


def test_a_new_turn_cancels_the_running_one(shared_server):
    async def go():
        async with aiohttp.ClientSession() as s:
            slow = await start_turn(s, shared_server.url, "e2e-lastwins", "slow [[mock ttft_ms=5000]]")
            fast = await run_turn(s, shared_server.url, "e2e-lastwins", "fast")
            return await slow, fast

    slow, fast = asyncio.run(go())
    assert slow.terminal == "turn.cancelled"
    assert slow.data("turn.cancelled")["reason"] == "superseded"
    assert slow.text == ""
    assert fast.terminal == "turn.completed" and fast.text == expected_text(5)
    # The cancelled turn's provider stream was closed, not left running.
    wait_until(lambda: get_json(shared_server.mock_url + "/stats")[2]["current"] == 0, 10, "mock streams to close")


def test_turns_posted_at_the_same_moment_end_one_superseded_and_one_completed(shared_server):
    """Two starts reach the actor together: the first is cancelled before its task ever ran, and
    its stream must still end (it once hung, with the turn counted in flight for good). A first
    token after 1 s keeps the first turn running until the second start comes, on a busy machine too."""
    async def go():
        async with aiohttp.ClientSession() as s:
            return [await asyncio.gather(*(run_turn(s, shared_server.url, f"e2e-together-{i}",
                                                    f"t{k} [[mock ttft_ms=1000]]", timeout=15)
                                           for k in range(2))) for i in range(3)]

    for pair in asyncio.run(go()):
        assert sorted(r.terminal for r in pair) == ["turn.cancelled", "turn.completed"]
        cancelled = next(r for r in pair if r.terminal == "turn.cancelled")
        assert cancelled.data("turn.cancelled")["reason"] == "superseded"
    wait_until(lambda: get_json(f"{shared_server.url}/readyz")[2].get("in_flight") == 0, 10, "no turn left in flight")


def test_client_disconnect_cancels_the_turn(shared_server):
    before = scrape(shared_server.url).get('agentos_turns_total{outcome="cancelled"}', 0)

    class Disconnect(Exception):
        pass

    async def go():
        async def on_event(name, result):
            if name == "turn.started":
                raise Disconnect

        async with aiohttp.ClientSession() as s:
            with pytest.raises(Disconnect):
                await run_turn(s, shared_server.url, "e2e-disconnect", "slow [[mock ttft_ms=10000]]", on_event=on_event)

    asyncio.run(go())
    wait_until(lambda: scrape(shared_server.url).get('agentos_turns_total{outcome="cancelled"}', 0) > before, 10,
               "the turn to be cancelled")
    wait_until(lambda: get_json(shared_server.mock_url + "/stats")[2]["current"] == 0, 10, "mock streams to close")


def test_a_disconnect_while_the_actor_was_stalled_still_cancels_the_turn(make_server):
    """The broker bounces what is sent to a peer silent past `broker.peer_timeout_secs`: a gone
    client's cancel, sent to an actor stalled that long, was lost, and the turn nobody reads ran
    (its tokens paid for) to its end. The gateway now sends it until the actor takes it."""
    server = make_server({"kernel": {"disconnect_grace_secs": 0}})
    sid = "e2e-stalled-disconnect"
    actor = server.pid(actor_name(sid, 2))
    stopped = []

    class Disconnect(Exception):
        pass

    async def go():
        async def on_event(name, result):
            if name == "turn.started":
                os.kill(actor, signal.SIGSTOP)
                stopped.append(actor)
                await asyncio.sleep(BrokerConfig().peer_timeout_secs + 0.5)
                raise Disconnect        # the client goes; the gateway's cancel meets a stalled actor

        async with aiohttp.ClientSession() as s:
            with pytest.raises(Disconnect):
                await run_turn(s, server.url, sid, "slow [[mock ttft_ms=30000]]", on_event=on_event)

    try:
        asyncio.run(go())
        time.sleep(0.5)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: scrape(server.url).get('agentos_turns_total{outcome="cancelled"}', 0) == 1, 15,
               "the turn to be cancelled")


def test_a_start_its_gateway_gave_up_on_or_whose_client_left_does_not_run(make_server):
    """A start queued at a stalled actor: its gateway answered 503 after TURN_START_TIMEOUT_SECS,
    and the turn ran all the same once the actor came back, its input in a transcript the client
    was told nothing reached. And a client that left while its start waited: the turn ran (its
    tokens paid for) with nobody to read it."""
    from broker.protocol import TURN_START_TIMEOUT_SECS

    server = make_server()
    sid = "e2e-stalled-start"
    actor = server.pid(actor_name(sid, 2))

    async def leave(text, after):
        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                await run_turn(s, server.url, sid, text, timeout=after)

    os.kill(actor, signal.SIGSTOP)      # the starts below wait in the actor's queue
    try:
        refused = turn(server.url, sid, "refused [[mock ttft_ms=20]]")
    finally:
        os.kill(actor, signal.SIGCONT)
    assert refused.status == 503 and refused.error["code"] == "actor_unavailable"
    os.kill(actor, signal.SIGSTOP)
    try:
        asyncio.run(leave("left [[mock ttft_ms=1000]]", 1.0))
        time.sleep(1.0)
    finally:
        os.kill(actor, signal.SIGCONT)
    time.sleep(2.5)                     # the time either would have taken to complete
    after = turn(server.url, sid, "after")
    assert after.terminal == "turn.completed"
    status, _, body = get_json(f"{server.url}/v1/sessions/{sid}/messages")
    assert status == 200 and [m["content"] for m in body["messages"]] == ["after", after.text]
    completed = 'agentos_turns_total{outcome="completed"}'
    wait_until(lambda: scrape(server.url).get(completed, 0) >= 1, 10, "the last turn to be counted")
    time.sleep(1.5)                     # each process flushes its counts once a second
    assert scrape(server.url).get(completed, 0) == 1, f"a turn nobody streams ran ({TURN_START_TIMEOUT_SECS} s)"


def test_provider_concurrency_never_exceeds_the_limit(shared_server):
    status, _, _ = get_json(shared_server.mock_url + "/stats/reset", method="POST")
    assert status == 200

    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*(run_turn(s, shared_server.url, f"e2e-limit-{i}", "go [[mock ttft_ms=150]]")
                                          for i in range(50)))

    results = asyncio.run(go())
    assert [r.terminal for r in results] == ["turn.completed"] * 50
    stats = get_json(shared_server.mock_url + "/stats")[2]
    assert stats["requests"] >= 50
    assert stats["max_concurrent"] == 5  # concurrency_limit of the shared server: reached, never exceeded


@pytest.mark.parametrize("marker,code", [("error=500", "server_error"), ("error=disconnect", "disconnect")])
def test_provider_failures_end_the_turn_with_their_cause(shared_server, marker, code):
    result = turn(shared_server.url, f"e2e-fail-{code}", f"fail [[mock {marker}]]")
    assert result.status == 200
    assert result.terminal == "turn.failed"
    error = result.data("turn.failed")["error"]
    assert error["code"] == code and error["message"]


@pytest.mark.parametrize("path,body,headers,status,code", [
    ("/v1/sessions/s1/turns", b"{not json", {}, 400, "invalid_json"),
    ("/v1/sessions/s1/turns", b"[1, 2]", {}, 400, "invalid_json"),
    ("/v1/sessions/s1/turns", b'{"text": "x"}', {}, 400, "invalid_input"),
    ("/v1/sessions/s1/turns", b'{"input": ""}', {}, 400, "invalid_input"),
    ("/v1/sessions/s1/turns", b'{"input": 42}', {}, 400, "invalid_input"),
    ("/v1/sessions/bad%20id!/turns", b'{"input": "x"}', {}, 400, "invalid_session_id"),
    ("/v1/sessions/" + "a" * 200 + "/turns", b'{"input": "x"}', {}, 400, "invalid_session_id"),
    ("/v1/sessions/s1/turns", b'{"input": "' + b"x" * (2 << 20) + b'"}', {}, 413, "body_too_large"),
    ("/v1/sessions/s1/turns", b'{"input": "' + b"x" * 300_000 + b'"}', {}, 413, "input_too_large"),
    ("/v1/nothing-here", b"", {}, 404, "not_found"),
])
def test_bad_http_input_gets_4xx_json(shared_server, path, body, headers, status, code):
    got, _, payload = get_json(shared_server.url + path, method="POST", body=body, headers=headers)
    assert got == status
    assert payload["error"]["code"] == code and payload["error"]["message"]


def test_wrong_method_is_405_json(shared_server):
    got, headers, payload = get_json(shared_server.url + "/v1/sessions/s1/turns", method="GET")
    assert got == 405 and payload["error"]["code"] == "method_not_allowed"


def test_cancel_endpoint(shared_server):
    async def go():
        async with aiohttp.ClientSession() as s:
            slow = await start_turn(s, shared_server.url, "e2e-cancel", "slow [[mock ttft_ms=5000]]")
            async with s.delete(f"{shared_server.url}/v1/sessions/e2e-cancel/turns/current") as resp:
                body = await resp.json()
            async with s.delete(f"{shared_server.url}/v1/sessions/e2e-cancel/turns/current") as resp:
                again = (resp.status, await resp.json())
            return await slow, body, again

    slow, body, again = asyncio.run(go())
    assert body["cancelled"] is True
    assert again[0] == 404 and again[1]["error"]["code"] == "no_active_turn"
    assert slow.terminal == "turn.cancelled" and slow.data("turn.cancelled")["reason"] == "client_cancel"


def test_trace_shows_the_hops_of_a_turn(shared_server, tmp_path):
    wanted = {"turn.start", "turn.started", "permit.request", "permit.grant", "turn.delta", "permit.release",
              "turn.done"}
    out = tmp_path / "trace.txt"

    def whole_turns():
        kinds: dict[str, set] = {}
        for line in out.read_text().splitlines():
            parts = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if parts.get("session") == "e2e-trace":
                kinds.setdefault(parts["turn"], set()).add(line.split()[1])
        return [t for t, k in kinds.items() if wanted <= k]

    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "agentos.cli", "trace", "--config",
                                 str(shared_server.config_path), "--session", "e2e-trace", "--timeout", "30"],
                                cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        try:
            # The subscription reaches the broker asynchronously: turn until one is seen whole.
            deadline = time.monotonic() + 25
            while not whole_turns() and time.monotonic() < deadline:
                assert turn(shared_server.url, "e2e-trace", "trace me").terminal == "turn.completed"
        finally:
            proc.terminate()
            proc.wait(10)
    assert whole_turns(), out.read_text()
    assert "no server is running" not in out.read_text()
    start = next(line for line in out.read_text().splitlines() if " turn.start " in line)
    assert "gateway/0 -> actor/" in start and "hop=" in start and "ms" in start


def test_clients_that_go_away_mid_stream_leave_no_error_in_the_log(make_server):
    """Real processes: many clients drop their connection while deltas are flowing. A client
    going away is routine for a streaming server: its turns are cancelled after the grace, and
    the log says so without an ERROR and a traceback for each one."""
    server = make_server({"kernel": {"disconnect_grace_secs": 0, "concurrency_limit": 256}})

    # 200 tokens a second still flow when a client leaves; 50 streams at 2,000 a second buried a
    # machine starved to 0.3 of a CPU for over 120 s (8 s at 200)
    async def go():
        async def one(i: int, s: aiohttp.ClientSession) -> None:
            async with s.post(f"{server.url}/v1/sessions/gone-{i}/turns",
                              json={"input": "go [[mock ttft_ms=5 tps=200 tokens=60000]]"}) as resp:
                assert resp.status == 200
                seen = 0
                async for _ in resp.content.iter_any():
                    seen += 1
                    if seen == 20:
                        break
                resp.close()   # the connection closed under a stream still being written

        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(one(i, s) for i in range(50)))

    asyncio.run(go())
    wait_until(lambda: get_json(f"{server.url}/readyz")[2].get("in_flight") == 0, 30, "every dropped turn to end")
    assert "Traceback" not in server.log() and " ERROR " not in server.log(), server.log()[-3000:]


def test_a_server_started_beside_packages_named_like_ours_runs_its_own(make_server, tmp_path):
    """`agent-os serve` run from a checkout of some other project: its agentos/, storage/, …
    packages must not be what the children import."""
    cwd = tmp_path / "elsewhere"
    for name in ("agentos", "actors", "broker", "gateway", "storage", "bench"):
        (cwd / name).mkdir(parents=True)
        (cwd / name / "__init__.py").write_text(f"raise ImportError('the {name} package of another project')\n")
    server = make_server(start=False)
    server.cwd = cwd
    server.start()
    done = turn(server.url, "elsewhere", "hello")
    assert done.terminal == "turn.completed" and done.text == expected_text(5)
    assert "another project" not in server.log_path.read_text()
