"""writer/log's memory of the ids it wrote lately: a re-sent record is recognised while its sender
could still retry it, forgotten after that or past the cap, and a failed record's id is let in again."""
from storage.recent_ids import RecentIds


def test_an_id_is_recognised_until_its_horizon_then_forgotten():
    ids = RecentIds(horizon_secs=60.0, cap=100)
    ids.add(b"a", now=0.0)
    ids.add(b"b", now=30.0)
    ids.expire(now=59.0)
    assert b"a" in ids and b"b" in ids
    ids.expire(now=61.0)
    assert b"a" not in ids and b"b" in ids
    ids.expire(now=91.0)
    assert len(ids) == 0


def test_past_the_cap_the_oldest_ids_go_first():
    ids = RecentIds(horizon_secs=60.0, cap=3)
    for n in range(5):
        ids.add(bytes([n]), now=float(n))
    ids.expire(now=5.0)
    assert [bytes([n]) in ids for n in range(5)] == [False, False, True, True, True]


def test_a_discarded_id_is_let_in_again_and_then_kept_for_a_whole_horizon():
    ids = RecentIds(horizon_secs=60.0, cap=100)
    ids.add(b"x", now=0.0)
    ids.discard(b"x")              # its batch failed: the sender's retry must be written
    assert b"x" not in ids
    ids.add(b"x", now=50.0)        # the retry, written
    ids.expire(now=61.0)           # the failed write's entry ages out; the retry's does not
    assert b"x" in ids
    ids.expire(now=111.0)
    assert b"x" not in ids
