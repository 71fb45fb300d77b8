"""writer/store's loader after a batch that failed (storage/store.py `run_loader`): each failure
halves the next batch, which is tried soon; once at the smallest, again only after a second. On a
12 MiB disk the logs shared, the store took 5 s to find a batch that fit, a second per halving."""
import errno
import threading

from storage.store import LOAD_RETRY_SECS, MIN_READ_BYTES, READ_BYTES, SMALLER_RETRY_SECS, Store


class Instant(threading.Event):
    def wait(self, timeout=None):
        return self.is_set()


class Stopping:
    """The loader's stop flag, noting each wait; set after `count` of them."""

    def __init__(self, count):
        self.waits, self.count = [], count

    def wait(self, secs):
        self.waits.append(secs)
        return self.is_set()

    def is_set(self):
        return len(self.waits) >= self.count


def test_a_smaller_batch_is_tried_soon_after_a_full_disk_and_the_smallest_after_a_second(tmp_path, monkeypatch):
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    tried = []

    def full():
        tried.append(store.read_bytes)
        store.read_bytes = max(MIN_READ_BYTES, store.read_bytes // 2)   # as a failed batch does
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_load_once", full)
    store.wake, store.urgent, store.stopping = Instant(), Instant(), Stopping(8)
    store.run_loader()
    halvings = (READ_BYTES // MIN_READ_BYTES).bit_length() - 1
    assert tried == [READ_BYTES >> i for i in range(halvings)] + [MIN_READ_BYTES] * (8 - halvings)
    assert store.stopping.waits == [SMALLER_RETRY_SECS] * halvings + [LOAD_RETRY_SECS] * (8 - halvings)
    assert store.stats["load_errors"] == 8
    store.close()
