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
    return actor, replies


def test_a_start_overtaken_by_its_cancel_or_older_than_its_gateway_waited_is_not_run(monkeypatch):
    async def go():
        actor, replies = answering_actor(monkeypatch)

        def message(kind, turn_id, age=0.0, **body):
            return Message("gateway/0#1", kind, len(replies) + 100, time.time() - age, 0, "s", turn_id,
                           {"session": "s", "turn_id": turn_id, **body})

        # the client left; its cancel, resent, reached the actor before the start it cancels
        actor.on_turn_cancel(message(Kind.TURN_CANCEL, "t-left", reason="disconnect"))
        assert replies == [(Kind.TURN_STATUS, {"turn_id": "t-left", "state": "idle"})]
        actor.on_turn_start(message(Kind.TURN_START, "t-left", tenant="", input="hi"))
        # a start that waited at a stalled actor until its gateway had answered 503
        actor.on_turn_start(message(Kind.TURN_START, "t-old", 9.5, tenant="", input="hi", deadline=time.time() + 0.5))
        assert actor.turns == {} and len(replies) == 1
        assert "t-left" not in actor.unstarted_cancels      # a cancel is used once

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

        async def client_left(*args, **kwargs):
            raise asyncio.CancelledError

        monkeypatch.setattr(gateway.bus, "request", client_left)
        monkeypatch.setattr(gateway.bus, "request_callback", lambda actor, kind, body, *a, **k: sent.append((kind, body)))
        for keyed in ("kabc", None):
            with pytest.raises(asyncio.CancelledError):
                await gateway._stream_turn(None, "s", "t", "hi", "s", None, keyed)
        assert [(kind, body["reason"], body.get("after_secs")) for kind, body in sent] == [
            (Kind.TURN_CANCEL, "disconnect", 7), (Kind.TURN_CANCEL, "disconnect", None)]
        assert gateway.streams == {}

    asyncio.run(go())
