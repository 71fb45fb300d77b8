"""Where a session's fork may cut its transcript: never between a tool call and its results, and
by default as late as that allows; and its hold on the new session's turns is its own to end
(unit)."""
import asyncio

import pytest

from actors.closing import ClosingSessions
from actors.session_forks import clean_cut, fork_count

CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"id": "b"}]}
TRANSCRIPT = [{"role": "user", "content": "q"}, CALL, {"role": "tool", "tool_call_id": "a", "content": "1"},
              {"role": "tool", "tool_call_id": "b", "content": "2"}, {"role": "assistant", "content": "answer"},
              {"role": "user", "content": "q2"}, CALL, {"role": "tool", "tool_call_id": "a", "content": "3"}]


def test_a_cut_never_parts_a_tool_call_from_its_results():
    assert [n for n in range(len(TRANSCRIPT) + 1) if clean_cut(TRANSCRIPT, n)] == [0, 1, 4, 5, 6]
    # by default: all, less the call at the end whose results are not all in (a turn still running)
    assert fork_count(TRANSCRIPT, None) == 6
    assert fork_count(TRANSCRIPT[:5], None) == 5
    assert fork_count(TRANSCRIPT, 4) == 4 and fork_count(TRANSCRIPT, 1) == 1
    for wanted, says in ((2, "part a tool call"), (3, "part a tool call"), (7, "part a tool call"),
                         (9, "has 8 messages"), (0, "has 8 messages")):
        with pytest.raises(ValueError, match=says):
            fork_count(TRANSCRIPT, wanted)
    with pytest.raises(ValueError, match="no message"):
        fork_count([CALL], None)


def test_a_forks_hold_is_its_own_to_end_and_a_close_ends_only_its_own():
    async def main():
        closing = ClosingSessions()
        fork = closing.hold("s")
        closing.begin("s")            # a close comes while the fork holds the session's turns
        closing.end("s")              # the gateway is done with the close: the fork still holds
        assert "s" in closing
        waiting = asyncio.ensure_future(closing.wait("s"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        closing.release("s", fork)
        await asyncio.wait_for(waiting, 1.0)
        assert "s" not in closing
        closing.end("s")              # an end with nothing to end changes nothing
        assert "s" not in closing

    asyncio.run(main())
