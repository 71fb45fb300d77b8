"""A turn start nobody will stream is not run, and a close its gateway gave up on holds nothing:
unit-tested on an actor (and a gateway) without processes (the end-to-end case, a start queued at a stalled
actor, is in test_e2e_turns.py)."""
import asyncio
import logging
import time

import pytest

from actors.actor_process import Actor
from agentos.config import Config
from broker.protocol import Kind, Message
from gateway.app import Gateway


def answering_actor(monkeypatch) -> tuple[Actor, list]:
    """An actor (no processes; call from a running loop) and the replies it sends."""
    config = Config()
    config.provider.base_url = "http://127.0.0.1:9/v1"
    actor = Actor(config, 0, "ipc:///nonexistent/bus.sock", logging.getLogger("test"))
    replies: list = []
    monkeypatch.setattr(actor.bus, "reply", lambda msg, kind, body: replies.append((kind, body)))
    monkeypatch.setattr(actor.bus, "send", lambda to, kind, body, **_: replies.append((kind, body)))
    return actor, replies


def message(kind, turn_id, age=0.0, src="gateway/0#1", **body):
    return Message(src, kind, 100, time.time() - age, 0, "s", turn_id, {"session": "s", "turn_id": turn_id, **body})


def test_a_start_overtaken_by_its_cancel_or_older_than_its_gateway_waited_is_not_run(monkeypatch):
    async def go():
        actor, replies = answering_actor(monkeypatch)
        actor.dropped_streams["g0"] = time.monotonic() - 1   # a stream dropped long ago
        # the client left; its cancel, resent, reached the actor before the start it cancels
        actor.on_turn_cancel(message(Kind.TURN_CANCEL, "t-left", reason="disconnect", stream="g1"))
        assert list(actor.dropped_streams) == ["g1"]          # the expired one forgotten
        assert replies == [(Kind.TURN_STATUS, {"turn_id": "t-left", "state": "idle"})]
        actor.on_turn_start(message(Kind.TURN_START, "t-left", tenant="", input="hi", stream="g1"))
        # a start that waited at a stalled actor until its gateway had answered 503
        actor.on_turn_start(message(Kind.TURN_START, "t-old", 9.5, tenant="", input="hi", deadline=time.time() + 0.5))
        assert actor.turns == {} and len(replies) == 1

    asyncio.run(go())


def test_a_close_that_comes_after_its_gateway_gave_up_holds_nothing(monkeypatch):
    """The gateway answered the close 503; had the actor begun it later, the session's turns would
    have waited out a hold nobody ends (the gateway's end of it came first, or never)."""
    async def go():
        actor, replies = answering_actor(monkeypatch)
        late = Message("gateway/0#1", Kind.SESSION_CLOSE, 1, time.time() - 15, 0, "s", "",
                       {"session": "s", "deadline": time.time() - 0.1})
        await asyncio.wait_for(actor.on_session_close(late), 5.0)   # (begun, it waits for the runs' load)
        assert "s" not in actor.closing and replies == []

    asyncio.run(go())


def test_a_keyed_start_whose_client_left_is_cancelled_after_the_grace_and_any_other_at_once(monkeypatch):
    """A client that leaves before its start is answered: the gateway cancels the turn. A keyed
    one's client may send the start again for the stream, so its cancel waits the disconnect grace
    (on a machine starved to 0.75 of a CPU, the actor had begun the turn, and a cancel at once
    ended it under the client that came back). Gateway without processes; its bus faked."""
    async def go():
        config = Config()
        config.kernel.disconnect_grace_secs = 7
        gateway = Gateway(config, "ipc:///nonexistent/bus.sock", 0, logging.getLogger("test"))
        sent = []

        starts = []

        async def client_left(actor, kind, body, **kwargs):
            starts.append(body)
            raise asyncio.CancelledError

        monkeypatch.setattr(gateway.bus, "request", client_left)
        monkeypatch.setattr(gateway.bus, "request_callback", lambda actor, kind, body, *a, **k: sent.append((kind, body)))
        for keyed in ("kabc", None):
            with pytest.raises(asyncio.CancelledError):
                await gateway._stream_turn(None, "s", "t", "hi", "s", None, keyed)
        assert [(kind, body["reason"], body.get("after_secs")) for kind, body in sent] == [
            (Kind.TURN_CANCEL, "disconnect", 7), (Kind.TURN_CANCEL, "disconnect", None)]
        # each cancel names the stream its start named, and no two streams share a name
        assert [body["stream"] for _, body in sent] == [body["stream"] for body in starts]
        assert len({body["stream"] for body in starts}) == 2
        assert gateway.streams == {}

    asyncio.run(go())


def test_a_keyed_turns_cancel_from_a_stream_its_client_left_spares_the_stream_it_came_back_on(monkeypatch):
    """A keyed start's client left before its answer and sent the start again. The first
    stream's cancel (resent until the actor takes it) may come after the second stream took the
    turn, or before the first start: either way the turn runs for the stream that reads it, and the
    first stream's start does not take the turn back. The second stream's own cancel still counts."""
    async def go():
        actor, replies = answering_actor(monkeypatch)

        def start(stream, src):   # (its journal checked: the key's turn never ran)
            actor.on_turn_start(message(Kind.TURN_START, "t-key", src=src, tenant="", input="hi", keyed=True,
                                        stream=stream), journal_checked=True)

        def cancel(stream):
            actor.on_turn_cancel(message(Kind.TURN_CANCEL, "t-key", reason="disconnect", after_secs=5, stream=stream))

        try:
            start("first", "gateway/0#1")
            start("second", "gateway/1#1")    # sent again: streamed from its start to the new gateway
            turn = actor.turns["t-key"]
            assert turn.gateway == "gateway/1#1" and turn.pending_cancel is None
            cancel("first")                   # late: the turn is the second stream's now
            assert turn.pending_cancel is None and not turn.cancel_reason
            start("first", "gateway/0#1")     # the first start, resent, comes last
            assert turn.gateway == "gateway/1#1"
            cancel("second")                  # the client left again: cancelled after the grace
            assert turn.pending_cancel is not None
            start("third", "gateway/0#1")     # and back within it
            assert turn.pending_cancel is None and turn.gateway == "gateway/0#1"

            # the first stream's cancel before both starts: the second one starts the turn
            replies.clear()
            cancel("a")
            actor.on_turn_start(message(Kind.TURN_START, "t-other", tenant="", input="hi", keyed=True, stream="a"),
                                journal_checked=True)
            assert "t-other" not in actor.turns
            actor.on_turn_start(message(Kind.TURN_START, "t-other", tenant="", input="hi", keyed=True, stream="b"),
                                journal_checked=True)
            assert actor.turns["t-other"].stream == "b" and replies[-1][0] is Kind.TURN_STARTED
        finally:
            for turn in actor.turns.values():
                turn.task.cancel()
                if turn.pending_cancel is not None:
                    turn.pending_cancel.cancel()
            await asyncio.gather(*(t.task for t in actor.turns.values()), return_exceptions=True)

    asyncio.run(go())
