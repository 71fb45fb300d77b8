"""The gateway's memory of each session's newest checkpoint (gateway/latest_checkpoints.py)."""
from gateway.latest_checkpoints import ENTRY_OVERHEAD_BYTES, Checkpoint, LatestCheckpoints

COST = ENTRY_OVERHEAD_BYTES + 1 + 1    # an entry's cost beside its payload: a 1-character session and key


def test_keeps_the_newest_checkpoint_whatever_order_they_arrive_in():
    latest = LatestCheckpoints(max_bytes=1 << 20)
    assert latest.get("s") is None
    latest.offer("s", Checkpoint("k2", 2, b"two"))
    # A store read that raced a PUT returns an older one: it must not replace the newer.
    assert latest.offer("s", Checkpoint("k1", 1, b"one")) == Checkpoint("k2", 2, b"two")
    assert latest.get("s") == Checkpoint("k2", 2, b"two")
    latest.offer("s", Checkpoint("k3", 3, b"three"))
    assert latest.get("s").key == "k3" and latest.bytes == len(b"three") + COST + 1   # key "k3"


def test_the_byte_bound_drops_the_least_recently_used_sessions():
    latest = LatestCheckpoints(max_bytes=25 + 2 * COST)
    for name in "ab":
        latest.offer(name, Checkpoint("k", 1, b"x" * 10))
    assert latest.evicted == 0                          # a miss may still trust "not here = older"
    latest.offer("c", Checkpoint("k", 1, b"x" * 10))
    assert latest.evicted == 1                          # ... not any more: the store must catch up
    assert latest.get("a") is None                      # 3 entries > 2: the oldest went
    assert latest.get("b") is not None                  # ... and b is now the most recent
    latest.offer("d", Checkpoint("k", 1, b"y" * 10))
    assert latest.get("c") is None and latest.get("b") is not None and latest.get("d") is not None
    assert latest.bytes == 20 + 2 * COST
    empty = LatestCheckpoints(max_bytes=0)               # cache off: every read goes to the store
    empty.offer("s", Checkpoint("k", 1, b"z"))
    assert empty.get("s") is None and empty.bytes == 0


def test_tiny_checkpoints_count_what_each_entry_costs_not_only_their_payload():
    """A byte bound of payloads alone held a million sessions of empty checkpoints: gigabytes."""
    latest = LatestCheckpoints(max_bytes=100 * COST)
    for i in range(10_000):
        latest.offer(str(i % 10), Checkpoint("k", i, b""))            # the same 10 sessions: no growth
    assert len(latest.entries) == 10
    for i in range(10_000):
        latest.offer(f"s{i}", Checkpoint("k", 1, b""))
    assert len(latest.entries) <= 100 and latest.bytes <= latest.max_bytes


def test_sync_to_is_read_as_log_positions_and_anything_else_is_refused():
    import pytest

    from storage.store_process import _positions

    assert _positions([[0, 10], [1, 2048]]) == {0: 10, 1: 2048}
    assert _positions([]) == {}
    for bad in ([[0]], [[0, -1]], [["0", 1]], [[0, 1.5]], [(0, 1)], [[True, 1]]):
        with pytest.raises(ValueError, match="sync_to"):
            _positions(bad)


def test_a_held_checkpoint_is_read_in_the_same_call_and_a_miss_still_counts_once():
    import asyncio
    import types

    from agentos.config import from_dict
    from gateway.access import AccessLog
    from gateway.errors import ApiError
    from gateway.fast_path import FrontConnection, FrontServer
    from gateway.tenancy import DEFAULT_TENANT

    class Transport:
        def __init__(self):
            self.out = []

        def write(self, data):
            self.out.append(bytes(data))

        def writelines(self, parts):
            self.out.append(b"".join(parts))

        def is_closing(self):
            return False

    async def go():
        latest = LatestCheckpoints(max_bytes=1 << 20)
        latest.offer("held", Checkpoint("k7", 7, b"state"))

        async def from_store(tenant, sid):
            assert latest.get(sid) is None          # what HistoryRoutes.latest_checkpoint does first
            raise ApiError(404, "not_found", "this session has no checkpoint")
        gateway = types.SimpleNamespace(config=from_dict({}), tenant_for=lambda auth: DEFAULT_TENANT,
                                        access=AccessLog(None),
                                        history=types.SimpleNamespace(latest=latest, latest_checkpoint=from_store))
        conn = FrontConnection(FrontServer(gateway, None))
        transport = Transport()
        conn.connection_made(transport)
        get = "GET /v1/sessions/{}/checkpoints/latest HTTP/1.1\r\nHost: x\r\n\r\n"
        conn.data_received((get.format("held") + get.format("held")).encode())
        # both answered before this coroutine yielded once: no task, in order
        assert len(transport.out) == 2 and conn.request is None
        head, _, body = transport.out[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"X-Checkpoint-Key: k7" in head and body == b"state"
        assert latest.hits == 2 and latest.misses == 0
        conn.data_received(get.format("unknown").encode())
        assert len(transport.out) == 2 and conn.request is not None     # a miss goes to the store, in a task
        await conn.task
        assert transport.out[2].startswith(b"HTTP/1.1 404") and latest.misses == 1
    asyncio.run(go())


def test_a_pushed_out_session_is_remembered_by_where_its_checkpoint_lies():
    from gateway import latest_checkpoints

    latest = LatestCheckpoints(max_bytes=10 + COST)           # one 10-byte checkpoint at a time
    assert latest.needed("new") == {}                           # never written here: the start will do
    latest.offer("a", Checkpoint("k", 1, b"x" * 10, (1, 500)))
    latest.offer("b", Checkpoint("k", 1, b"x" * 10, (0, 700)))  # pushes a out
    assert latest.get("a") is None and latest.needed("a") == {1: 500}
    assert latest.needed("new") == {}                           # others need no more than before
    latest.offer("c", Checkpoint("k", 1, b"x" * 10))            # read from the store ...
    latest.offer("d", Checkpoint("k", 1, b"x" * 10, (0, 900)))  # ... and pushed out: the store has it
    assert latest.needed("c") == {} and latest.needed("b") == {0: 700}
    latest.offer("a", Checkpoint("k", 2, b"y" * 10, (1, 800)))  # written again: held, not gone
    assert latest.needed("a") == {} and latest.get("a").seq == 2
    latest.forget("d")
    assert latest.needed("d") is None                           # closed since: the logs' ends
    latest.offer("d", Checkpoint("k", 3, b"z" * 10, (0, 950)))
    assert latest.needed("d") == {}                             # written again after its close

    few = LatestCheckpoints(max_bytes=0)
    few_gone, latest_checkpoints.MAX_GONE = latest_checkpoints.MAX_GONE, 2
    try:
        for i, where in enumerate([(0, 10), (1, 40), (0, 30)]):
            few.offer(f"s{i}", Checkpoint("k", 1, b"", where))
    finally:
        latest_checkpoints.MAX_GONE = few_gone
    # past the bound, those forgotten one by one count as far as the furthest of them
    assert few.needed("s2") == {0: 30, 1: 40} and few.needed("s0") == {0: 10, 1: 40} == few.needed("new")


def _routes(config: dict, log: int, positions: list[int], settled: list):
    """HistoryRoutes over a fake log (each PUT durable at the next of `positions` in log `log`)
    and a fake store that has nothing; returns (routes, the store queries asked)."""
    import types

    from agentos.config import from_dict
    from gateway.history import HistoryRoutes

    ends = iter(positions)
    gateway = types.SimpleNamespace(config=from_dict(config), log_client=types.SimpleNamespace(
        log_of=lambda sid: log, append_then=lambda kind, body, session, done: done(next(ends), None)))
    routes = HistoryRoutes(gateway)
    routes.settled = settled
    asked: list[dict] = []

    async def query(q):
        asked.append(q)
        return {"rows": []}
    routes._query = query
    return routes, asked


async def _read_latest(routes, sid: str) -> None:
    from gateway.errors import ApiError

    try:
        await routes.latest_checkpoint("t", sid)
    except ApiError:
        pass     # the fake store has none: 404


def test_a_miss_asks_the_store_only_for_what_its_answer_depends_on():
    import asyncio

    async def go():
        routes, asked = _routes({"gateway": {"checkpoint_cache_mb": 1}}, 2, [1000, 1001], [[0, 100], [2, 50]])
        big = b"x" * (600 << 10)                                  # one fits in a megabyte, not two
        await routes.save_checkpoint("t", "old", "old", "k", big)
        await routes.save_checkpoint("t", "new", "new", "k", big)   # pushes "old" out
        for sid in ("old", "never", "new"):
            await _read_latest(routes, sid)
        assert [q["session"] for q in asked] == ["old", "never"]     # "new" is held: no query
        assert asked[0]["sync_to"] == [[0, 100], [2, 1000]]          # as far as its own checkpoint
        assert asked[1]["sync_to"] == [[0, 100], [2, 50]]            # as far as the start
        routes.latest.forget("never")
        await _read_latest(routes, "never")
        assert asked[2].get("sync") is True and "sync_to" not in asked[2]
    asyncio.run(go())


def test_a_checkpoint_acknowledged_before_the_log_placed_it_is_read_with_sync_once_pushed_out():
    """With durability `none` a PUT is answered on receipt: the position its answer names is not
    yet where the record ends, so a miss on it must wait for the logs' ends."""
    from gateway import latest_checkpoints
    from gateway.latest_checkpoints import UNPLACED

    latest = LatestCheckpoints(max_bytes=0)
    latest.offer("a", Checkpoint("k", 1, b"", UNPLACED))
    latest.offer("b", Checkpoint("k", 1, b"", (0, 40)))
    assert latest.needed("a") is None and latest.needed("b") == {0: 40} and latest.needed("new") == {}
    few_gone, latest_checkpoints.MAX_GONE = latest_checkpoints.MAX_GONE, 2
    try:
        latest.offer("c", Checkpoint("k", 1, b"", (0, 50)))       # folds a and b
    finally:
        latest_checkpoints.MAX_GONE = few_gone
    assert latest.needed("new") is None                           # a is no longer told apart


def test_with_durability_none_a_pushed_out_checkpoint_is_read_as_of_the_logs_ends():
    import asyncio

    async def go():
        routes, asked = _routes({"gateway": {"checkpoint_cache_mb": 0}, "storage": {"durability": "none"}},
                                0, [7], [[0, 5]])
        answer = await routes.save_checkpoint("t", "s", "s", "k", b"x")
        assert answer["durability"] == "none"
        await _read_latest(routes, "s")
        assert asked[0].get("sync") is True and "sync_to" not in asked[0]
    asyncio.run(go())


def test_a_session_neither_the_stores_filter_nor_this_gateway_knows_is_answered_without_the_store():
    import asyncio

    import pytest

    from gateway.errors import ApiError
    from storage.bloom import BloomFilter

    async def go():
        routes, asked = _routes({"gateway": {"checkpoint_cache_mb": 0}}, 0, [10, 20], [[0, 5]])
        await _read_latest(routes, "never")
        assert [q["session"] for q in asked] == ["never"]     # no filter from the store yet: it is asked
        before = BloomFilter()
        before.add("blob:old")                               # a checkpoint from before this process
        routes.before = before
        with pytest.raises(ApiError) as missing:
            await routes.latest_checkpoint("t", "never")
        assert missing.value.status == 404 and len(asked) == 1
        await _read_latest(routes, "old")
        await routes.save_checkpoint("t", "new", "new", "k", b"x")   # not held: the cache is off
        await _read_latest(routes, "new")
        assert [q["session"] for q in asked] == ["never", "old", "new"]
    asyncio.run(go())
