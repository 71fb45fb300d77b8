"""The mock model server (bench/mock_llm.py) as a real process.

One mock is started per module (port 0 read back from a port file) and stopped, then killed if
need be, at the end; each test resets /stats when it checks counters. Tests wait with deadlines,
never with a bare sleep. How a request is read and its reply planned (bench/mock_plan.py) is
tested in test_mock_plan.py, with the process and client helpers of this module.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from bench.mock_llm import expected_text

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_SECS = 10.0
STOP_TIMEOUT_SECS = 5.0
PROFILE_ENV = {"MOCK_TTFT_MS": "20", "MOCK_TPS": "1000", "MOCK_TOKENS": "5"}
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("search", "fetch")]

pytestmark = pytest.mark.timeout(30)


# ---------------------------------------------------------------------------------------------
# Process handling

@dataclass
class Mock:
    proc: subprocess.Popen
    port: int
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_mock(tmp_path: Path, extra_env: dict[str, str] | None = None) -> Mock:
    """Start the mock on port 0 and wait (with a deadline) for its port file."""
    port_file = tmp_path / "port"
    stderr_path = tmp_path / "mock.stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_")}
    env.update(PROFILE_ENV, **(extra_env or {}))
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.mock_llm", "--port", "0", "--port-file", str(port_file)],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    mock = Mock(proc, 0, stderr_path)
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"mock exited with {proc.returncode}: {stderr_path.read_text()}")
        if time.monotonic() > deadline:
            stop_mock(mock)
            raise TimeoutError(f"mock wrote no port file within {START_TIMEOUT_SECS}s")
        time.sleep(0.01)
    mock.port = int(port_file.read_text())
    return mock


def stop_mock(mock: Mock, sig: int = signal.SIGTERM) -> int:
    """Signal, wait, then kill; the process must be gone afterwards. Returns the exit code."""
    if mock.proc.poll() is None:
        mock.proc.send_signal(sig)
        try:
            mock.proc.wait(STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            mock.proc.kill()
            mock.proc.wait(STOP_TIMEOUT_SECS)
    assert not pid_alive(mock.proc.pid), f"mock pid {mock.proc.pid} is still alive"
    return mock.proc.returncode


@pytest.fixture(scope="module", name="mock")
def fixture_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mock]:
    proc = start_mock(tmp_path_factory.mktemp("mock"))
    try:
        yield proc
    finally:
        code = stop_mock(proc)
    # Faults and vanished clients must not leave tracebacks or warnings behind.
    lines = proc.stderr_path.read_text().splitlines()
    assert code == 0 and len(lines) == 1 and lines[0].startswith("mock-llm listening"), lines


# ---------------------------------------------------------------------------------------------
# Client helpers

def run(coro):
    return asyncio.run(coro)


def chat(text: str, *, stream: bool = True, usage: bool = False, **extra) -> dict:
    body: dict = {"model": "mock-model", "messages": [{"role": "user", "content": text}], **extra}
    if stream:
        body["stream"] = True
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def parse_sse(raw: bytes) -> list[bytes]:
    """SSE events of a complete stream (each `data: ...` followed by a blank line)."""
    events = raw.split(b"\n\n")
    assert events[-1] == b"", raw[-200:]
    for event in events[:-1]:
        assert event.startswith(b"data: "), event
    return [event[len(b"data: "):] for event in events[:-1]]


async def post(url: str, body: dict | bytes) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (aiohttp.ClientSession() as session,
                session.post(url + "/v1/chat/completions", data=data,
                             headers={"Content-Type": "application/json"}) as resp):
        return resp.status, dict(resp.headers), await resp.read()


async def get_json(url: str, path: str, method: str = "GET") -> dict:
    async with aiohttp.ClientSession() as session, session.request(method, url + path) as resp:
        assert resp.status == 200
        return await resp.json()


def stream_chunks(raw: bytes) -> tuple[list[dict], list[bytes]]:
    events = parse_sse(raw)
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]], events


def wait_for_stats(url: str, predicate, what: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = run(get_json(url, "/stats"))
        if predicate(stats):
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: last stats {stats}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# Streams and completions

def test_stream_is_openai_chunks_that_concatenate_to_expected_text(mock: Mock) -> None:
    status, headers, raw = run(post(mock.url, chat("hello there")))
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    chunks, _ = stream_chunks(raw)
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == "mock-model"
        assert isinstance(c["created"], int)
        assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 5
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == expected_text(5)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}


def test_usage_chunk_comes_last_when_asked_for(mock: Mock) -> None:
    text = "count these characters please"
    _, _, raw = run(post(mock.url, chat(text, usage=True)))
    chunks, _ = stream_chunks(raw)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    prompt = max(1, len(text) // 4)
    assert chunks[-1]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 5,
                                   "total_tokens": prompt + 5}


def test_non_stream_completion(mock: Mock) -> None:
    status, _, raw = run(post(mock.url, chat("hi", stream=False)))
    assert status == 200
    body = orjson.loads(raw)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": expected_text(5)}}]
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}


def test_models_and_healthz(mock: Mock) -> None:
    assert run(get_json(mock.url, "/v1/models")) == {"object": "list",
                                                     "data": [{"id": "mock", "object": "model"}]}
    assert run(get_json(mock.url, "/healthz")) == {"ok": True}


# ---------------------------------------------------------------------------------------------
# Stats

def test_stats_count_concurrent_streams_and_reset(mock: Mock) -> None:
    n = 20

    async def burst() -> list[bytes]:
        async with aiohttp.ClientSession() as session:
            await (await session.post(mock.url + "/stats/reset")).read()

            async def one() -> bytes:
                # ttft long enough that all streams are open at once, on a loaded machine too
                body = chat("together [[mock ttft_ms=3000]]")
                async with session.post(mock.url + "/v1/chat/completions", json=body) as resp:
                    return await resp.read()

            return await asyncio.gather(*(one() for _ in range(n)))

    for raw in run(burst()):
        stream_chunks(raw)
    stats = wait_for_stats(mock.url, lambda s: s["current"] == 0, "streams to finish")
    assert stats["max_concurrent"] == n
    assert stats["requests"] == n and stats["completed"] == n
    assert stats["tokens_out"] == 5 * n and stats["errors"] == {}
    reset = run(get_json(mock.url, "/stats/reset", method="POST"))
    assert reset == {"requests": 0, "current": 0, "max_concurrent": 0, "completed": 0,
                     "errors": {}, "tokens_out": 0}


# ---------------------------------------------------------------------------------------------
# Faults

def test_error_429_has_retry_after(mock: Mock) -> None:
    run(get_json(mock.url, "/stats/reset", method="POST"))
    status, headers, raw = run(post(mock.url, chat("x [[mock error=429]]")))
    assert status == 429
    assert headers["Retry-After"] == "1"
    assert orjson.loads(raw)["error"]["type"] == "rate_limit_error"
    assert run(get_json(mock.url, "/stats"))["errors"] == {"429": 1}


def test_error_500(mock: Mock) -> None:
    status, _, raw = run(post(mock.url, chat("x [[mock error=500]]", stream=False)))
    assert status == 500
    assert orjson.loads(raw)["error"]["message"]


def test_disconnect_breaks_the_stream_midway(mock: Mock) -> None:
    async def read_until_broken() -> tuple[list[bytes], BaseException | None]:
        lines: list[bytes] = []
        async with (aiohttp.ClientSession() as session,
                    session.post(mock.url + "/v1/chat/completions",
                                 json=chat("x [[mock error=disconnect tokens=6]]")) as resp):
            assert resp.status == 200
            try:
                async for line in resp.content:
                    lines.append(line)
            except aiohttp.ClientError as exc:
                return lines, exc
        return lines, None

    lines, error = run(read_until_broken())
    assert isinstance(error, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                              aiohttp.ClientConnectionError)), error
    received = [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    content = [c for c in received if c["choices"][0]["delta"].get("content")]
    assert 0 < len(content) < 6
    assert b"data: [DONE]\n" not in lines


def test_hang_holds_the_stream_until_the_client_leaves(mock: Mock) -> None:
    run(get_json(mock.url, "/stats/reset", method="POST"))

    async def hang() -> tuple[bytes, dict]:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(mock.url + "/v1/chat/completions",
                                      json=chat("x [[mock error=hang ttft_ms=0]]"))
            try:
                role = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(resp.content.readany(), 0.3)
                async with session.get(mock.url + "/stats") as r:
                    stats = await r.json()
            finally:
                resp.close()  # drops the connection
            return role, stats

    role, stats = run(hang())
    assert orjson.loads(role[6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert stats["current"] == 1 and stats["errors"] == {"hang": 1}
    stats = wait_for_stats(mock.url, lambda s: s["current"] == 0, "hung stream to be released")
    assert stats["completed"] == 0


def test_slow_delays_the_first_token_tenfold(mock: Mock) -> None:
    async def first_token_secs() -> float:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            async with session.post(mock.url + "/v1/chat/completions",
                                    json=chat("x [[mock error=slow ttft_ms=40]]")) as resp:
                async for line in resp.content:
                    if b'"content":" ' in line:
                        return time.monotonic() - started
        raise AssertionError("no content token")

    assert run(first_token_secs()) >= 0.38


# ---------------------------------------------------------------------------------------------
# Tool calls

def test_tool_calls_stream_then_text_after_tool_results(mock: Mock) -> None:
    question = "what is the weather like in Paris this fine morning, please?"
    first = chat(f"{question} [[mock tool_calls=search,fetch]]", tools=TOOLS)
    status, _, raw = run(post(mock.url, first))
    assert status == 200
    chunks, _ = stream_chunks(raw)
    calls: dict[int, dict] = {}
    for chunk in chunks[1:-1]:
        (delta_call,) = chunk["choices"][0]["delta"]["tool_calls"]
        call = calls.setdefault(delta_call["index"], {"arguments": ""})
        if "id" in delta_call:
            assert delta_call["type"] == "function" and delta_call["function"]["arguments"] == ""
            call.update(id=delta_call["id"], name=delta_call["function"]["name"])
        else:
            call["arguments"] += delta_call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [calls[i]["name"] for i in sorted(calls)] == ["search", "fetch"]
    for call in calls.values():
        assert call["id"].startswith("call_")
        assert orjson.loads(call["arguments"]) == {"q": question[:40]}

    follow_up = dict(first)
    follow_up["messages"] = first["messages"] + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": c["id"], "type": "function",
                         "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in calls.values()]},
        *({"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls.values()),
    ]
    _, _, raw = run(post(mock.url, follow_up))
    chunks, _ = stream_chunks(raw)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == expected_text(5)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_calls_non_stream_and_unknown_tool(mock: Mock) -> None:
    status, _, raw = run(post(mock.url, chat("find [[mock tool_calls=fetch]]", stream=False,
                                             tools=TOOLS)))
    assert status == 200
    choice = orjson.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "fetch", "arguments": '{"q":"find"}'}

    status, _, raw = run(post(mock.url, chat("find [[mock tool_calls=nope]]", tools=TOOLS)))
    assert status == 400
    assert "nope" in orjson.loads(raw)["error"]["message"]
    # a model that makes a tool up: asked for on purpose, it is called though not offered
    status, _, raw = run(post(mock.url, chat("find [[mock made_up_tool_calls=nope]]", stream=False, tools=TOOLS)))
    assert status == 200
    assert orjson.loads(raw)["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "nope"


# ---------------------------------------------------------------------------------------------
# Process behaviour

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_start_line_and_clean_exit_on_signal(tmp_path: Path, sig: int) -> None:
    proc = start_mock(tmp_path)
    try:
        line = proc.stderr_path.read_text().strip()
    finally:
        code = stop_mock(proc, sig)
    assert line == (f"mock-llm listening on http://127.0.0.1:{proc.port} "
                    "(ttft=20ms tps=1000 tokens=5 error_rate=0)")
    assert code == 0
