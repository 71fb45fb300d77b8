"""Closing a session while other requests for it are under way: a turn posted during the close,
a checkpoint PUT racing it, the actor's hold on the session's new turns (actors/closing.py)."""
import asyncio
import os
import signal
import threading
import time
import urllib.error
import urllib.request

from harness import get_json


def close_session(base: str, sid: str, closed: dict) -> None:
    """DELETE the session (in a thread of its own); its status, and its body if an error, in `closed`."""
    request = urllib.request.Request(f"{base}/v1/sessions/{sid}", method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            closed["status"] = resp.status
    except urllib.error.HTTPError as exc:
        closed.update(status=exc.code, body=exc.read())


def test_a_turn_posted_while_its_session_closes_lands_wholly_before_or_wholly_after_the_close(make_server):
    """Real processes: turns posted a few milliseconds apart from a DELETE of their session. A turn
    the close overtook is gone with the session; one that came after starts the id's new life,
    with no history from before the close and its transcript whole — never half of each."""
    import aiohttp
    from harness import run_turn, turn

    server = make_server()
    base = server.url
    fresh_prompt = turn(base, "fresh", "new").data("turn.completed")["usage"]["prompt_tokens"]

    async def race(sid, delay):
        async with aiohttp.ClientSession() as s:
            async def close():
                async with s.delete(f"{base}/v1/sessions/{sid}") as resp:
                    return resp.status

            async def late_turn():
                await asyncio.sleep(delay)
                return await run_turn(s, base, sid, "new")

            closed, result = await asyncio.gather(close(), late_turn())
            async with s.get(f"{base}/v1/sessions/{sid}/messages") as resp:
                messages = (await resp.json()).get("messages") if resp.status == 200 else None
            return closed, result, messages

    outcomes = []
    for i in range(16):
        sid = f"race-{i}"
        assert turn(base, sid, "old [[mock ttft_ms=5]]").terminal == "turn.completed"
        closed, result, messages = asyncio.run(race(sid, i * 0.001))
        assert closed == 204
        if messages is None:                      # the close came after the turn, or cancelled it
            outcomes.append("gone")
            continue
        assert result.terminal == "turn.completed", (i, result.events[-2:])
        assert result.data("turn.completed")["usage"]["prompt_tokens"] == fresh_prompt, i
        assert [m["content"] for m in messages] == ["new", result.text], i
        outcomes.append("after")
    assert "after" in outcomes, outcomes


def test_a_close_whose_actor_was_stalled_at_its_end_still_lets_the_next_turn_start(make_server):
    """The gateway tells the actor a close is done (SESSION_CLOSED) so that its held turns start.
    Told once, an actor stalled past the broker's peer timeout lost it, and the session's next
    turn waited out the hold's 15 s. It is now sent until the actor takes it."""
    from actors.closing import HOLD_SECS
    from agentos.config import BrokerConfig
    from broker.sharding import actor_name
    from harness import scrape, turn, wait_until

    server = make_server()
    sid = "close-stalled-actor"
    assert turn(server.url, sid, "old").terminal == "turn.completed"
    # The actor has loaded its open runs from the store (a close waits for that; the store is
    # stopped below): a read of a run it owns is answered after that.
    assert get_json(f"{server.url}/v1/runs/{sid}")[0] == 404
    store, actor = server.pid("writer/store"), server.pid(actor_name(sid, 2))
    closed = {}
    answers = 'agentos_bus_messages_total{kind="turn.status"}'   # the actor's answer to the close's first step
    before = scrape(server.url).get(answers, 0)
    began = time.monotonic()
    closer = threading.Thread(target=close_session, args=(server.url, sid, closed))
    os.kill(store, signal.SIGSTOP)      # the close waits on the store for where the logs end ...
    try:
        closer.start()                  # ... after its actor has stopped the session
        wait_until(lambda: scrape(server.url).get(answers, 0) > before, 30, "the actor to stop the session")
        os.kill(actor, signal.SIGSTOP)
        time.sleep(BrokerConfig().peer_timeout_secs + 0.5)
        os.kill(store, signal.SIGCONT)  # the close ends while the broker takes the actor for dead
        closer.join(40)
        assert closed.get("status") == 204, closed
    finally:
        os.kill(store, signal.SIGCONT)
        os.kill(actor, signal.SIGCONT)
        closer.join(40)
    result = turn(server.url, sid, "new")
    assert result.terminal == "turn.completed"
    # Without the notice the hold ends by itself, HOLD_SECS after the actor began it (after `began`):
    # the turn could not even have started before then.
    assert time.monotonic() - began < HOLD_SECS, "the next turn waited out the close's hold"
    prompt = result.data("turn.completed")["usage"]["prompt_tokens"]
    assert prompt == turn(server.url, "close-stalled-fresh", "new").data("turn.completed")["usage"]["prompt_tokens"]


def test_a_close_whose_actor_was_stopped_while_it_drained_is_done_not_busy(make_server):
    """A close waits (CLOSE_WAIT_SECS) for the session's records to be acknowledged. An actor
    stopped longer than that while it waited (SIGSTOP, a paused VM) woke to the acks unread in its
    socket and a wait already expired, and answered "busy": a 503 for a close that was done."""
    from actors.actor_process import CLOSE_WAIT_SECS
    from broker.sharding import actor_name
    from harness import turn

    server = make_server()
    sid = "close-stopped-draining"
    assert turn(server.url, sid, "old").terminal == "turn.completed"
    log, actor = server.pid("writer/log/0"), server.pid(actor_name(sid, 2))
    running = threading.Thread(target=turn, args=(server.url, sid, "long [[mock ttft_ms=60000]]"))
    running.start()
    closed = {}
    closer = threading.Thread(target=close_session, args=(server.url, sid, closed))
    try:
        time.sleep(1.0)                 # the turn runs: its records are acknowledged
        os.kill(log, signal.SIGSTOP)    # the turn's last records, on its cancel, are not
        closer.start()
        time.sleep(1.0)                 # the actor has cancelled the turn and waits for their acks
        os.kill(actor, signal.SIGSTOP)
        os.kill(log, signal.SIGCONT)    # the acks come, and wait in the stopped actor's socket
        time.sleep(CLOSE_WAIT_SECS + 1.0)
        os.kill(actor, signal.SIGCONT)
        closer.join(40)
        assert closed.get("status") == 204, closed
    finally:
        os.kill(log, signal.SIGCONT)
        os.kill(actor, signal.SIGCONT)
        if closer.ident is not None:
            closer.join(40)
        running.join(40)
    assert get_json(f"{server.url}/v1/sessions/{sid}/messages")[0] == 404


def test_a_closing_sessions_hold_ends_with_its_last_close_or_by_itself(monkeypatch):
    from actors import closing

    async def go():
        holds = closing.ClosingSessions()
        holds.begin("s")
        holds.begin("s")                  # two DELETEs in flight
        waiter = asyncio.ensure_future(holds.wait("s"))
        holds.end("s")
        await asyncio.sleep(0.01)
        assert "s" in holds and not waiter.done()
        holds.end("s")
        await asyncio.wait_for(waiter, 1)
        assert "s" not in holds
        holds.end("s")                    # a late or repeated notice is harmless
        monkeypatch.setattr(closing, "HOLD_SECS", 0.05)
        holds.begin("t")                  # its gateway never says it is done
        await asyncio.wait_for(holds.wait("t"), 1)
        assert "t" not in holds

    asyncio.run(go())


def test_a_checkpoint_put_racing_a_close_is_gone_with_it_or_the_new_latest_also_after_a_restart(make_server):
    """Real processes: PUTs a fraction of a millisecond to ten apart from a DELETE. The latest
    checkpoint afterwards is the racing PUT's or none — never the one from before the close — and a
    restarted tree answers the same."""
    import aiohttp

    server = make_server()

    async def race(base):
        seen = []
        async with aiohttp.ClientSession() as s:
            for i in range(20):
                sid = f"put-race-{i}"
                async with s.put(f"{base}/v1/sessions/{sid}/checkpoints/old", data=b"old") as resp:
                    assert resp.status == 200

                async def close():
                    async with s.delete(f"{base}/v1/sessions/{sid}") as resp:
                        return resp.status

                async def put():
                    await asyncio.sleep(i * 0.0005)
                    async with s.put(f"{base}/v1/sessions/{sid}/checkpoints/new", data=b"new") as resp:
                        return resp.status

                assert await asyncio.gather(close(), put()) == [204, 200]
                seen.append(await latest(s, base, sid))
        return seen

    async def latest(s, base, sid):
        async with s.get(f"{base}/v1/sessions/{sid}/checkpoints/latest") as resp:
            return resp.status, (await resp.read() if resp.status == 200 else b"")

    async def read_all(base):
        async with aiohttp.ClientSession() as s:
            return [await latest(s, base, f"put-race-{i}") for i in range(20)]

    seen = asyncio.run(race(server.url))
    assert set(seen) <= {(404, b""), (200, b"new")}, seen
    server.stop()
    assert asyncio.run(read_all(server.start().url)) == seen


def test_a_turn_held_behind_a_close_longer_than_its_gateway_waited_is_not_started(monkeypatch):
    """A close slower than the gateway's start timeout: the gateway answered 503, so the held start
    is dropped rather than run for nobody; one within the timeout starts once the close is done."""
    import logging

    from actors.actor_process import Actor
    from agentos.config import Config
    from broker.protocol import TURN_START_TIMEOUT_SECS, Kind, Message

    async def go():
        config = Config()
        config.provider.base_url = "http://127.0.0.1:9/v1"
        actor = Actor(config, 0, "ipc:///nonexistent/bus.sock", logging.getLogger("test"))
        started = []
        monkeypatch.setattr(actor, "on_turn_start", started.append)

        def start(turn_id, age):   # sent `age` seconds ago, with the deadline a gateway gives it
            sent = time.time() - age
            body = {"turn_id": turn_id, "session": "s", "tenant": "", "input": "hi",
                    "deadline": sent + TURN_START_TIMEOUT_SECS}
            return Message("gateway/0#1", Kind.TURN_START, 1, sent, 0, "s", turn_id, body)

        late, fresh = start("t-late", TURN_START_TIMEOUT_SECS + 1), start("t-fresh", 0)
        actor.closing.begin("s")
        held = [asyncio.ensure_future(actor._start_after_close(m)) for m in (late, fresh)]
        await asyncio.sleep(0.01)
        assert started == []
        actor.closing.end("s")
        await asyncio.gather(*held)
        return started

    assert [m.body["turn_id"] for m in asyncio.run(go())] == ["t-fresh"]
