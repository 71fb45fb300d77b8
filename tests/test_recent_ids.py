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


def test_a_restarts_refill_is_recognised_and_forgotten_a_generation_at_a_time():
    """A writer restarted on a busy log refills its ids from the tail all at one instant: they go
    in generations of a quarter of the cap each, the oldest dropped whole past the cap, the rest
    once the horizon has passed."""
    ids = RecentIds(horizon_secs=60.0, cap=1000)
    for n in range(1000):
        ids.add(b"actor/0:1:%d" % n, now=0.0)
    ids.add(b"gateway/0:1:1", now=1.0)
    assert all(b"actor/0:1:%d" % n in ids for n in range(1000)) and b"gateway/0:1:1" in ids
    ids.expire(now=1.0)
    assert len(ids) == 751
    assert b"actor/0:1:249" not in ids and b"actor/0:1:250" in ids
    ids.expire(now=61.5)
    assert len(ids) == 0 and not ids.generations
