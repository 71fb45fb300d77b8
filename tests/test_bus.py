"""The broker and the bus client in one process (the broker on a thread): routing, errors,
de-duplication and malformed input. The real-process versions are in the end-to-end tests."""
import asyncio

import pytest
import zmq

from broker import codec, frames
from broker.client import Bus, BusTimeout
from broker.protocol import Kind


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_request_reply_and_peer_table(broker):
    _, endpoint = broker

    async def go():
        calls = []

        def on_stats(msg):
            calls.append(msg.id)
            b.reply(msg, Kind.STATS_REPLY, {"role": "x", "stats": {"n": len(calls)}})

        a = Bus("gateway/0", endpoint)
        b = Bus("actor/0", endpoint, {Kind.STATS: on_stats})
        await a.start()
        await b.start()
        reply = await a.request("actor/0", Kind.STATS, {}, timeout=5)
        peers = (await a.request("broker", Kind.PEERS, {}, timeout=5)).body["peers"]
        await a.close()
        await b.close()
        return reply, peers

    reply, peers = run(go())
    assert reply.src == "actor/0" and reply.body["stats"] == {"n": 1}
    assert peers["actor/0"]["live"] and peers["actor/0"]["role"] == "actor"


@pytest.mark.parametrize("payload", ["", "b" * 200_000])
def test_unknown_destination_fails_fast_not_silently(broker, payload, monkeypatch):
    """The broker bounces a message for an unknown peer with the message's own header. A big one's
    header names the sender's region in shared memory: the sender must read the broker's reason,
    not its own body, and free the region."""
    from broker import requests
    _, endpoint = broker
    reasons = []   # what each bounced attempt heard (the last may miss the deadline on a loaded machine)
    heard = requests.Attempts.set_exception

    def hearing(self, exc):
        if isinstance(exc, requests.Undeliverable):
            reasons.append(str(exc))
        heard(self, exc)
    monkeypatch.setattr(requests.Attempts, "set_exception", hearing)

    async def go():
        a = Bus("gateway/0", endpoint)
        await a.start()
        try:
            with pytest.raises(BusTimeout):
                await a.request("actor/9", Kind.STATS, {"p": payload}, timeout=0.5, attempt_secs=0.1)
            for _ in range(500):   # every attempt's bounce back (each frees its region)
                if len(reasons) == a.retries + 1:
                    break
                await asyncio.sleep(0.01)
            assert reasons and all(r == "actor/9: unknown" for r in reasons), reasons
            ring = a._spill.ring
            if ring is not None:
                ring.put(b"")   # takes back what was freed
            return a.stats(), ring.in_use() if ring is not None else 0
        finally:
            await a.close()

    stats, in_use = run(go())
    assert stats["malformed"] == 0 and stats["spilled"] >= (2 if payload else 0)
    assert in_use == (1 if payload else 0)   # only the empty one just put


def test_bounces_and_retries_reach_the_counters(broker):
    """What the broker bounced (by reason) and what a bus sent again (by role) reach Prometheus:
    the broker adds its counts once a second, a bus at each heartbeat."""
    from agentos import metrics
    _, endpoint = broker
    bounced, retried = metrics.bus_undeliverable.labels("unknown"), metrics.bus_retries.labels("gateway")
    before = bounced._value.get(), retried._value.get()

    async def go():
        a = Bus("gateway/0", endpoint, heartbeat_secs=0.05)
        await a.start()
        try:
            with pytest.raises(BusTimeout, match="unknown"):
                await a.request("actor/9", Kind.STATS, {}, timeout=0.5, attempt_secs=0.1)
            retries = a.stats()["retries"]
            for _ in range(100):   # the broker's next once-a-second flush (one may have come mid-request)
                if bounced._value.get() - before[0] >= retries and retried._value.get() - before[1] >= retries:
                    break
                await asyncio.sleep(0.05)
            return a.stats()
        finally:
            await a.close()

    stats = run(go())
    assert stats["retries"] >= 1
    assert retried._value.get() - before[1] == stats["retries"]
    assert bounced._value.get() - before[0] >= stats["retries"]


async def registered(broker_obj, name: bytes) -> None:
    for _ in range(250):
        if name in broker_obj.identity_of:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name!r} never registered with the broker")


def resend_three_times(broker, kind: Kind, body: dict, reply_kind: Kind, reply_body) -> tuple[list, list, Bus]:
    """A raw peer sends one request (id 42) to actor/0 three times, each after the last reply."""
    broker_obj, endpoint = broker

    async def go():
        calls = []

        def handler(msg):
            calls.append(msg.id)
            b.reply(msg, reply_kind, reply_body(len(calls)))

        b = Bus("actor/0", endpoint, {kind: handler})
        await b.start()
        await registered(broker_obj, b"actor/0")
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.ROUTING_ID, b"writer/log/1#abc")   # the role that sends writer/store a purge
        raw.connect(endpoint)
        envelope = codec.encode("actor/0", kind, body, id=42)
        replies = []
        for _ in range(3):
            frames.send(raw, envelope)
            for _ in range(250):
                try:
                    replies.append(codec.decode(frames.recv(raw)))
                    break
                except zmq.Again:
                    await asyncio.sleep(0.02)
        raw.close(0)
        await b.close()
        return calls, replies, b

    return run(go())


def test_a_resent_request_runs_once_and_gets_the_same_reply(broker):
    calls, replies, _ = resend_three_times(broker, Kind.STORE_PURGE, {"runs": ["r1"]}, Kind.STORE_ROWS,
                                           lambda n: {"rows": [n]})
    assert len(calls) == 1
    assert len(replies) == 3 and {r.reply_to for r in replies} == {42}
    assert {r.body["rows"][0] for r in replies} == {1}


def test_a_resent_update_whose_reply_is_big_runs_once(broker):
    """An attribute's update answers with its value: its reply, too big to keep, let a request sent
    again (its reply bounced to a stalled requester, or crossing the resend) run the update twice."""
    calls, replies, bus = resend_three_times(broker, Kind.ATTR_UPDATE, {"run_id": "r1", "tenant": "t", "key": "n", "handler": "incr"},
                                             Kind.ATTR_VALUES, lambda n: {"found": True, "values": {"n": "x" * 8000 + str(n)}})
    assert len(calls) == 1
    assert [r.body["values"]["n"][-1] for r in replies] == ["1", "1", "1"]
    assert bus._replies.big_bytes > 8000


def test_big_replies_are_kept_up_to_their_budget_and_expiry_gives_it_back(monkeypatch):
    from broker import replies as replies_module
    monkeypatch.setattr(replies_module, "CACHE_BIG_BYTES", 12_000)
    kept = replies_module.Replies()
    for key in (("a", 1), ("a", 2)):
        assert kept.first_time(key) is None
        kept.answered(key, b"r" * 10_000)
    assert kept.first_time(("a", 1)) == b"r" * 10_000        # the first is sent again as it was
    assert kept.first_time(("a", 2)) is replies_module.RERUN  # past the budget: runs again
    kept.expire(float("inf"), keep=0)
    assert kept.big_bytes == 0 and not kept._seen
    assert kept.first_time(("a", 3)) is None
    kept.answered(("a", 3), b"r" * 10_000)
    assert kept.first_time(("a", 3)) == b"r" * 10_000


def test_a_resent_read_runs_again_and_its_reply_is_not_kept(broker):
    """A read changes nothing, so its reply is not held for a duplicate: writer/store asks each log
    writer's end for every new session's first read, and the gateway's log held ~1.7 MB of them."""
    calls, replies, bus = resend_three_times(broker, Kind.STATS, {}, Kind.STATS_REPLY,
                                             lambda n: {"role": "x", "stats": {"call": n}})
    assert len(calls) == 3
    assert [r.body["stats"]["call"] for r in replies] == [1, 2, 3]
    assert not bus._replies._seen      # nothing of it kept once answered


def test_malformed_input_is_counted_and_dropped(broker):
    b, endpoint = broker

    async def go():
        got = []
        peer = Bus("actor/0", endpoint, {Kind.STATS: lambda m: got.append(m)})
        await peer.start()
        await registered(b, b"actor/0")
        ctx = zmq.Context.instance()
        bad_identity = ctx.socket(zmq.DEALER)
        bad_identity.connect(endpoint)
        bad_identity.send(b"no identity, no protocol")
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.ROUTING_ID, b"fuzz/0#1")
        raw.connect(endpoint)
        raw.send_multipart([b"AOS/1", b"two", b"frames"])
        raw.send(b"AOS/9\x07actor/0" + b"x" * 20)
        raw.send(b"AOS/1\x07actor/0\x03???")
        raw.send(b"AOS/1\x06broker" + b"\x0bctl.unknown\x00\x00")
        # Well-routed but garbage inside: the broker forwards it, the peer counts and drops it.
        raw.send(codec.name_prefix("actor/0") + b"\x09ctl.stats\x02\x00\xc1\xc1\x80")
        raw.send(codec.encode("actor/0", Kind.STATS, {}, id=5))
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.02)
        bad_identity.close(0)
        raw.close(0)
        malformed_at_peer = peer.malformed
        await peer.close()
        return got, malformed_at_peer

    got, malformed_at_peer = run(go())
    assert len(got) == 1 and got[0].id == 5
    assert b.malformed >= 4
    assert malformed_at_peer >= 1

def test_a_request_to_a_peer_that_died_is_resent_when_it_comes_back(broker):
    """The first incarnation takes the request and dies without answering; the asker re-sends as
    soon as the broker sees the new incarnation, not after its attempt timeout."""
    broker_obj, endpoint = broker

    async def go():
        def answer(msg):
            second.reply(msg, Kind.STATS_REPLY, {"role": "store", "stats": {"by": "second"}})

        asker = Bus("actor/0", endpoint)
        first = Bus("writer/store", endpoint, {Kind.STATS: lambda msg: None})   # swallows it
        await asker.start()
        await first.start()
        await registered(broker_obj, b"writer/store")
        # One attempt would outlast the test's whole 20-second budget (see run()).
        pending = asyncio.ensure_future(asker.request("writer/store", Kind.STATS, {}, timeout=60, attempt_secs=60))
        await asyncio.sleep(0.3)
        await first.close()
        second = Bus("writer/store", endpoint, {Kind.STATS: answer})
        await second.start()
        reply = await pending
        await asker.close()
        await second.close()
        return reply

    assert run(go()).body["stats"] == {"by": "second"}


@pytest.mark.parametrize("spill_bytes", [0, 8 << 20])
def test_big_messages_keep_their_order_spilled_or_whole(broker, spill_bytes):
    """Without a ring, envelopes of 64 KiB and more are sent alone (a batch would copy them at
    both ends), each after the small ones queued before it. With one, their bodies go through
    shared memory and the small envelopes left travel in one batch. Either way one peer's
    messages to another keep their order and their content."""
    b_, endpoint = broker
    big = "x" * (200 * 1024)

    async def go():
        got = []
        done = asyncio.Event()

        def on_stats(msg):
            got.append(msg.body)
            if len(got) == 5:
                done.set()

        a = Bus("gateway/0", endpoint, spill_bytes=spill_bytes)
        b = Bus("actor/0", endpoint, {Kind.STATS: on_stats})
        await a.start()
        await b.start()
        for _ in range(100):   # sends are not retried: the broker must know actor/0 first
            if "actor/0" in (await a.request("broker", Kind.PEERS, {}, timeout=5)).body["peers"]:
                break
            await asyncio.sleep(0.05)
        before = b_.routed
        for i, payload in enumerate(["s0", big, "s2", big + "3", "s4"]):   # one loop iteration
            a.send("actor/0", Kind.STATS, {"i": i, "p": payload})   # fields a kind does not declare travel too
        await asyncio.wait_for(done.wait(), 10)
        for _ in range(100):   # the broker's thread counts a frame just after sending it on
            if b_.routed - before >= 5:
                break
            await asyncio.sleep(0.01)
        routed = b_.routed - before
        spilled = a.stats()["spilled"]
        await a.close()
        await b.close()
        return got, routed, spilled

    got, routed, spilled = run(go())
    assert [(s["i"], len(s["p"])) for s in got] == [(0, 2), (1, len(big)), (2, 2), (3, len(big) + 1), (4, 2)]
    assert got[1]["p"] == big and got[3]["p"] == big + "3"
    if spill_bytes:
        assert (routed, spilled) == (1, 2)   # one batch of five small envelopes
    else:
        assert (routed, spilled) == (5, 0)   # s0 | big | s2 | big3 | s4: no batch held a big one


def test_control_messages_and_replies_are_taken_only_from_their_sender(broker):
    """A drain from anyone but the supervisor, a permit release from anyone but an actor, a reply
    from anyone but the asked peer: counted as malformed and dropped (a peer fuzzer's drain once
    shut the gateway, its lease fenced a log writer, its releases paused every turn's permits)."""
    _, endpoint = broker

    async def go():
        seen, held = [], []

        def on(msg):
            seen.append((msg.kind, msg.src))

        def on_stats(msg):   # answered once the forged reply was dropped
            held.append(msg)

        async def until(condition):
            for _ in range(1000):
                if condition():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("not within 10 s")

        target = Bus("gateway/0", endpoint, {Kind.DRAIN: on, Kind.PERMIT_RELEASE: on})
        asked = Bus("actor/1", endpoint, {Kind.STATS: on_stats})
        rogue = Bus("rogue/0", endpoint)
        supervisor = Bus("supervisor", endpoint)
        actor = Bus("actor/0", endpoint)
        for bus in (target, asked, rogue, supervisor, actor):
            await bus.start()
        try:
            rogue.send("gateway/0", Kind.DRAIN, {"deadline_secs": 1})
            rogue.send("gateway/0", Kind.PERMIT_RELEASE, {"permit_id": "p", "backoff_secs": 1e9})
            supervisor.send("gateway/0", Kind.DRAIN, {"deadline_secs": 1})
            actor.send("gateway/0", Kind.PERMIT_RELEASE, {"permit_id": "p"})
            request = asyncio.ensure_future(target.request("actor/1", Kind.STATS, {}, timeout=30))
            await until(lambda: held)
            forged = next(iter(target._pending))
            rogue.send("gateway/0", Kind.STATS_REPLY, {"role": "forged", "stats": {}}, reply_to=forged)
            await until(lambda: target.malformed >= 3)
            asked.reply(held[0], Kind.STATS_REPLY, {"role": "asked", "stats": {"true": 1}})
            reply = await request
            return seen, reply, target.malformed
        finally:
            for bus in (target, asked, rogue, supervisor, actor):
                await bus.close()

    seen, reply, malformed = run(go())
    assert sorted(seen) == [(Kind.DRAIN, "supervisor"), (Kind.PERMIT_RELEASE, "actor/0")]   # two senders: any order
    assert reply.src == "actor/1" and reply.body["stats"] == {"true": 1}
    assert malformed == 3

