"""How the mock model reads a request and plans its reply (bench/mock_plan.py).

The profile is checked in-process; markers, message text, bad requests and the profile's error
rate through a real mock process, started and stopped with the helpers of test_mock_llm.py (one
mock for this module, whose stderr must hold nothing but its start line at the end).
"""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.mock_llm import expected_text
from bench.mock_plan import MockProfile
from test_mock_llm import TOOLS, Mock, chat, get_json, post, run, start_mock, stop_mock, stream_chunks
from test_mock_llm import fixture_mock  # noqa: F401  (the module's `mock` fixture)

pytestmark = pytest.mark.timeout(30)


# ---------------------------------------------------------------------------------------------
# Markers and message text

def test_marker_overrides_token_count(mock: Mock) -> None:
    _, _, raw = run(post(mock.url, chat("short [[mock tokens=2 tps=5000 ttft_ms=0]]")))
    chunks, _ = stream_chunks(raw)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected_text(2)


def test_prompt_tokens_count_all_message_text(mock: Mock) -> None:
    system = "You are a terse assistant."
    parts = [{"type": "text", "text": "first part, "}, {"type": "text", "text": "second part"}]
    body = {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": parts}]}
    status, _, raw = run(post(mock.url, body))
    assert status == 200
    chars = len(system) + sum(len(p["text"]) for p in parts)
    assert orjson.loads(raw)["usage"]["prompt_tokens"] == chars // 4


# ---------------------------------------------------------------------------------------------
# Bad requests

@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "JSON"),
    (orjson.dumps({"model": "m"}), "messages"),
    (orjson.dumps(chat("x [[mock colour=blue]]")), "colour"),
    (orjson.dumps(chat("x [[mock tps=fast]]")), "tps"),
    (orjson.dumps(chat("x [[mock error=explode]]")), "error"),
])
def test_bad_requests_get_400(mock: Mock, body: bytes, needle: str) -> None:
    status, _, raw = run(post(mock.url, body))
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]


# ---------------------------------------------------------------------------------------------
# Process behaviour

def test_error_rate_applies_the_profile_error_kind(tmp_path: Path) -> None:
    proc = start_mock(tmp_path, {"MOCK_ERROR_RATE": "1", "MOCK_ERROR_KIND": "429",
                                 "MOCK_RETRY_AFTER_SECS": "3"})
    try:
        status, headers, _ = run(post(proc.url, chat("plain request")))
        stats = run(get_json(proc.url, "/stats"))
    finally:
        code = stop_mock(proc)
    assert (status, headers["Retry-After"]) == (429, "3")
    assert stats["errors"] == {"429": 1}
    assert code == 0


def test_bad_environment_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="MOCK_TPS"):
        start_mock(tmp_path, {"MOCK_TPS": "fast"})


# ---------------------------------------------------------------------------------------------
# Profile (in-process)

def test_profile_defaults_and_env() -> None:
    assert MockProfile.from_env({}) == MockProfile(ttft_ms=2000, tps=200, tokens=8, error_rate=0.0,
                                                   error_kind="500", retry_after_secs=1)
    profile = MockProfile.from_env({"MOCK_TTFT_MS": "20", "MOCK_TPS": "1000", "MOCK_TOKENS": "5",
                                    "MOCK_ERROR_RATE": "0.25", "MOCK_ERROR_KIND": "disconnect",
                                    "MOCK_RETRY_AFTER_SECS": "7", "UNRELATED": "x"})
    assert profile == MockProfile(20, 1000, 5, 0.25, "disconnect", 7)


@pytest.mark.parametrize(("var", "value"), [
    ("MOCK_TTFT_MS", "soon"),
    ("MOCK_TTFT_MS", "-1"),
    ("MOCK_TPS", "0"),
    ("MOCK_TPS", "nan"),
    ("MOCK_TOKENS", "2.5"),
    ("MOCK_TOKENS", "-3"),
    ("MOCK_ERROR_RATE", "1.5"),
    ("MOCK_ERROR_RATE", "-0.1"),
    ("MOCK_ERROR_KIND", "explode"),
    ("MOCK_RETRY_AFTER_SECS", "-1"),
])
def test_profile_rejects_bad_values_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        MockProfile.from_env({var: value})


def test_a_history_whose_tool_calls_are_not_all_answered_is_a_400_as_openai_gives(mock: Mock) -> None:
    asked = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]}
    answer_a = {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}
    answer_b = {"role": "tool", "tool_call_id": "call_b", "content": "rain"}
    later = {"role": "user", "content": "and now?"}

    def status_of(*history: dict) -> tuple[int, str]:
        body = chat("hi", tools=TOOLS)
        body["messages"] = body["messages"] + list(history)
        status, _, raw = run(post(mock.url, body))
        return status, raw.decode()

    assert status_of(asked, answer_b, answer_a, later)[0] == 200   # answered in any order
    status, text = status_of(asked, answer_a, later)                 # call_b left without an answer
    assert status == 400 and "call_b" in text and "call_a" not in text
    assert status_of(asked, answer_a)[0] == 400                      # nor at the history's end
    status, text = status_of(answer_a, later)                        # an answer to nothing
    assert status == 400 and "call_a" in text
    assert status_of(asked, answer_a, answer_b, answer_a, later)[0] == 400   # answered twice
