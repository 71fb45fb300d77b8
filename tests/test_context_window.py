"""What of a session's history a model call is sent under `provider.max_context_chars`: the
current turn whole, the newest older exchanges that fit, from a user message (unit)."""
import orjson

from actors.context_window import answered, context

CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function",
                                                            "function": {"name": "f", "arguments": "{}"}}]}


def history(turns: int) -> list[dict]:
    out = []
    for n in range(turns):
        out += [{"role": "user", "content": f"question {n} " + "x" * 40}, CALL,
                {"role": "tool", "tool_call_id": "a", "content": "r" * 30},
                {"role": "assistant", "content": f"answer {n} " + "y" * 40}]
    return out


def size(messages: list[dict]) -> int:
    return sum(len(orjson.dumps(m)) for m in messages)


def test_a_window_holds_the_current_turn_and_the_newest_older_messages_that_fit():
    messages = history(10) + [{"role": "user", "content": "now"}]
    assert context(messages, 0) is messages                      # no budget: everything
    assert context(messages, 10**9) == messages
    for budget in (50, 200, 400, 800, 1600):
        sent = context(messages, budget)
        assert sent[-1] == messages[-1] and messages[-len(sent):] == sent   # the newest, in order
        assert size(sent) <= budget or len(sent) == 1
        assert sent[0]["role"] == "user"   # whole exchanges: never a result without its call
        earlier = messages[:-len(sent)]                          # as many whole exchanges as fit
        back = max((i for i, m in enumerate(earlier) if m["role"] == "user"), default=None)
        assert back is None or size(messages[back:]) > budget
    # mid-turn: the turn's own call and results go whole, whatever they take
    mid = messages + [CALL, {"role": "tool", "tool_call_id": "a", "content": "z" * 500}]
    sent = context(mid, 100)
    assert sent == mid[-3:] and size(sent) > 100


def test_a_tool_call_left_without_its_answer_is_answered_in_what_is_sent():
    asked = {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {}},
                                                                 {"id": "b", "type": "function", "function": {}}]}
    answer_b = {"role": "tool", "tool_call_id": "b", "content": "{}"}
    history = [{"role": "user", "content": "x"}, asked, answer_b, {"role": "user", "content": "y"}]
    sent = answered(history)
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [("user", None), ("assistant", None), ("tool", "b"),
                                                                  ("tool", "a"), ("user", None)]
    assert "cut short" in sent[3]["content"] and len(history) == 4    # the transcript itself is not changed
    whole = [history[0], asked, answer_b, {"role": "tool", "tool_call_id": "a", "content": "{}"}, history[3]]
    assert answered(whole) is whole                                      # nothing missing: the same list
    # the cut call's answer written after the next question (a superseding turn that began first)
    late = [history[0], asked, answer_b, history[3], {"role": "tool", "tool_call_id": "a", "content": "{}"},
            {"role": "assistant", "content": "y"}]
    assert [(m["role"], m.get("tool_call_id")) for m in answered(late)] == [
        ("user", None), ("assistant", None), ("tool", "b"), ("tool", "a"), ("user", None), ("assistant", None)]
