"""End-to-end: a small disk the logs share with writer/store's DuckDB files and payload segments
(the default layout). What writer/store writes as it loads must not keep taking the room it
needs: a load that failed for want of room gives its room back, and superseded payloads leave
the payload segments before they fill the disk. The full-disk tests are in test_e2e_full_disk.py."""
import os
import signal
import time
import urllib.request

from agentos.config import BrokerConfig

from harness import Server, scrape, wait_until
from disk_filling import fill_with_checkpoints, put, put_new_sessions, read_back, tmpfs, wait_for_the_store

SMALL = {"storage": {"segment_bytes": 256 << 10, "spare_segments": 1, "compaction_interval_secs": 1}}


def free_bytes(directory):
    disk = os.statvfs(directory)
    return disk.f_bavail * disk.f_frsize


def test_a_load_that_found_no_room_gives_it_back_and_the_store_catches_up(tmp_path):
    """writer/store stopped while the logs fill 12 MiB, then another file takes all but 2 MiB:
    the store's first load (its copies of the checkpoints it keeps, about 2.9 MB) cannot fit.
    The payloads it had copied once stayed on the disk as garbage, filling it to the last byte:
    every smaller retry failed, and the disk stayed full for good (0 of 60 PUTs over 30 s). Now
    a failed load gives them back, a smaller batch fits, and compaction frees the rest.

    The store is stopped past the broker's peer timeout before the fill, as a loaded machine had
    it once (the fill took 5.6 s): the broker bounced the logs' `log.flushed` notices, and with
    the logs quiet after, the store never heard where they end and loaded none of it for good
    (0 of 60 PUTs; the store had heard of 509 bytes of the 5.6 MB written). It now asks a quiet log."""
    with tmpfs(tmp_path / "data", "12m") as data:
        server = Server(tmp_path, SMALL).start()
        store = server.pid("writer/store")
        try:
            os.kill(store, signal.SIGSTOP)
            try:
                time.sleep(BrokerConfig().peer_timeout_secs + 0.5)
                kept = fill_with_checkpoints(server.url)
                with open(data / "other", "wb") as other:
                    other.write(b"\0" * (free_bytes(data) - (2 << 20)))
                    os.fsync(other.fileno())
            finally:
                os.kill(store, signal.SIGCONT)
            assert len(kept) > 50
            # (a PUT taken is no sign of it: the fill's last refusal can leave room for one more)
            wait_for_the_store(server.url)
            assert "a batch into DuckDB failed" in server.log()   # the first load did not fit
            wait_until(lambda: put(server.url, "hot", "k", b"after" * 2400)[0] == 200, 30,
                       "the log to take appends again", interval=0.5)
            put_new_sessions(server.url, 10)
            read_back(server.url, kept)
        finally:
            assert server.stop() == 0


def test_superseded_payloads_on_a_small_disk_leave_the_payload_segments(tmp_path):
    """Each load copies out the newest checkpoint of every session it has one of; the next one
    supersedes it. Payload compaction began only once the segments held
    `storage.payload_compaction_min_mb` (64): on a 12 MiB disk they filled it first. It now
    begins at a sixteenth of their disk."""
    config = {"gateway": {"checkpoint_cache_mb": 0}, **SMALL}   # latest reads wait for the store's load
    with tmpfs(tmp_path / "data", "12m"):
        server = Server(tmp_path, config).start()
        try:
            sessions = [f"s{i}" for i in range(20)]
            for n in range(8):                       # 8 loads of 20 sessions' 12 KB: 1.9 MB
                for sid in sessions:
                    assert put(server.url, sid, f"k{n}", b"%03d" % n + b"p" * 12000)[0] == 200
                urllib.request.urlopen(f"{server.url}/v1/sessions/s0/checkpoints/latest", timeout=10).read()
            wait_until(lambda: scrape(server.url).get("agentos_payload_freed_bytes_total", 0) > 0, 30,
                       "a payload compaction pass", interval=0.5)
            wait_until(lambda: scrape(server.url)["agentos_payload_file_bytes"] < 4 * 20 * 12003, 30,
                       "the payload segments to hold less than half of what was copied", interval=0.5)
            for sid in sessions:
                with urllib.request.urlopen(f"{server.url}/v1/sessions/{sid}/checkpoints/latest", timeout=10) as resp:
                    assert (resp.headers["X-Checkpoint-Key"], resp.read()) == ("k7", b"007" + b"p" * 12000)
        finally:
            assert server.stop() == 0
