"""The gateway's memory of each session's newest checkpoint (gateway/latest_checkpoints.py)."""
from gateway.latest_checkpoints import Checkpoint, LatestCheckpoints


def test_keeps_the_newest_checkpoint_whatever_order_they_arrive_in():
    latest = LatestCheckpoints(max_bytes=1 << 20)
    assert latest.get("s") is None
    latest.offer("s", Checkpoint("k2", 2, b"two"))
    # A store read that raced a PUT returns an older one: it must not replace the newer.
    assert latest.offer("s", Checkpoint("k1", 1, b"one")) == Checkpoint("k2", 2, b"two")
    assert latest.get("s") == Checkpoint("k2", 2, b"two")
    latest.offer("s", Checkpoint("k3", 3, b"three"))
    assert latest.get("s").key == "k3" and latest.bytes == len(b"three")


def test_the_byte_bound_drops_the_least_recently_used_sessions():
    latest = LatestCheckpoints(max_bytes=25)
    for name in "ab":
        latest.offer(name, Checkpoint("k", 1, b"x" * 10))
    assert latest.evicted == 0                          # a miss may still trust "not here = older"
    latest.offer("c", Checkpoint("k", 1, b"x" * 10))
    assert latest.evicted == 1                          # ... not any more: the store must catch up
    assert latest.get("a") is None                      # 30 bytes > 25: the oldest went
    assert latest.get("b") is not None                  # ... and b is now the most recent
    latest.offer("d", Checkpoint("k", 1, b"y" * 10))
    assert latest.get("c") is None and latest.get("b") is not None and latest.get("d") is not None
    assert latest.bytes == 20
    empty = LatestCheckpoints(max_bytes=0)               # cache off: every read goes to the store
    empty.offer("s", Checkpoint("k", 1, b"z"))
    assert empty.get("s") is None and empty.bytes == 0


def test_sync_to_is_read_as_log_positions_and_anything_else_is_refused():
    import pytest

    from storage.store_process import _positions

    assert _positions([[0, 10], [1, 2048]]) == {0: 10, 1: 2048}
    assert _positions([]) == {}
    for bad in ([[0]], [[0, -1]], [["0", 1]], [[0, 1.5]], [(0, 1)], [[True, 1]]):
        with pytest.raises(ValueError, match="sync_to"):
            _positions(bad)
