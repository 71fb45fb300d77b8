from actors.permits import PermitPool


def test_limit_and_fifo():
    pool = PermitPool(limit=2)
    assert pool.request("a", "actor/0", "t", 0) == [("actor/0", "a")]
    assert pool.request("b", "actor/1", "t", 0) == [("actor/1", "b")]
    assert pool.request("c", "actor/0", "t", 0) == []
    assert pool.request("d", "actor/0", "t", 0) == []
    assert pool.release("a", 1) == [("actor/0", "c")]
    assert pool.release("b", 1) == [("actor/0", "d")]
    assert len(pool.held) == 2


def test_round_robin_between_tenants():
    pool = PermitPool(limit=1)
    pool.request("busy0", "actor/0", "busy", 0)
    for i in range(1, 5):
        pool.request(f"busy{i}", "actor/0", "busy", 0)
    pool.request("quiet0", "actor/1", "quiet", 0)
    order = []
    current = "busy0"
    for _ in range(5):
        grant = pool.release(current, 1)
        current = grant[0][1]
        order.append(current)
    assert order.index("quiet0") == 1  # the quiet tenant waits behind one busy grant, not four


def test_duplicate_request_regrants_and_release_of_waiter_cancels():
    pool = PermitPool(limit=1)
    pool.request("a", "actor/0", "t", 0)
    assert pool.request("a", "actor/0", "t", 0) == [("actor/0", "a")]  # lost grant re-sent
    pool.request("b", "actor/0", "t", 0)
    assert pool.release("b", 0) == []      # cancelled while waiting
    assert pool.release("a", 0) == []
    assert not pool.held and not pool.waiting


def test_backoff_pauses_all_grants():
    pool = PermitPool(limit=2)
    pool.request("a", "actor/0", "t", 0)
    assert pool.release("a", 10.0, backoff_secs=5) == []
    assert pool.request("b", "actor/1", "u", 11.0) == []
    assert pool.tick(14.9) == []
    assert pool.tick(15.1) == [("actor/1", "b")]


def test_new_incarnation_drops_old_permits_and_sync_reconciles():
    pool = PermitPool(limit=2, grace_secs=2)
    pool.sync("actor/0", 1, [], [], 0)
    pool.request("a", "actor/0", "t", 0)
    pool.request("b", "actor/0", "t", 0)
    pool.request("c", "actor/1", "t", 0)
    assert pool.sync("actor/0", 2, [], [], 1) == [("actor/1", "c")]  # restarted: its permits come back
    pool.request("d", "actor/1", "t", 1)
    assert pool.sync("actor/1", 5, ["d"], [], 10) == []               # released "c" without telling us
    assert set(pool.held) == {"d"}


def test_sync_adopts_permits_after_a_scheduler_restart_and_silent_holders_expire():
    pool = PermitPool(limit=1, holder_timeout_secs=15)
    pool.sync("actor/0", 1, ["x"], [], 0)
    assert pool.request("y", "actor/1", "t", 0) == []  # "x" still counts against the limit
    pool.sync("actor/1", 1, [], ["y"], 14)
    assert pool.tick(16) == [("actor/1", "y")]        # actor/0 went silent: its permit returns


def test_a_back_off_whose_release_was_lost_still_pauses_grants_through_the_holders_sync():
    """The release that carries a provider's back-off is one-way: lost (a scheduler stalled past
    the broker's peer timeout, or restarted), the pause was skipped until the next 429. The
    holder's sync repeats what is left of it until it ends."""
    import asyncio
    import time

    from actors.permit_client import PermitClient
    from broker.protocol import Kind

    class Bus:
        name, incarnation = "actor/0", 7

        def __init__(self):
            self.sent = []

        def send(self, dest, kind, body, **_):
            self.sent.append((kind, body))

    async def go():
        bus = Bus()
        client = PermitClient(bus)
        acquiring = asyncio.ensure_future(client.acquire("t"))
        await asyncio.sleep(0)
        permit_id = bus.sent[0][1]["permit_id"]
        client.on_grant(type("Grant", (), {"body": {"permit_id": permit_id}})())
        await acquiring
        client.release(permit_id, backoff_secs=30.0)
        assert bus.sent[-1][0] == Kind.PERMIT_RELEASE      # ... and the broker loses it
        client._sync()
        return bus.sent[-1]

    kind, body = asyncio.run(go())
    assert kind == Kind.PERMIT_SYNC and 29.0 < body["backoff_secs"] <= 30.0
    pool = PermitPool(limit=1, holder_timeout_secs=60)
    pool.sync("actor/0", 7, [], [], 100.0)
    assert pool.sync("actor/0", 7, body["held"], body["waiting"], 100.0, body["backoff_secs"]) == []
    assert pool.request("b", "actor/1", "u", 101.0) == []   # paused though no release said so
    assert pool.tick(100.0 + body["backoff_secs"] + 0.1) == [("actor/1", "b")]
    later = PermitClient(Bus())
    later.paused_until = time.monotonic() - 1.0              # over: the sync stops repeating it
    later._sync()
    assert "backoff_secs" not in later.bus.sent[-1][1]
