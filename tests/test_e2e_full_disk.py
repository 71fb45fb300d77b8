"""End-to-end: the log's disk fills up. SYNC writes fail fast with 507 and a log line, nothing
acknowledged is lost, records nobody waits for are written once space comes back, and the server
recovers by itself."""
import collections
import os
import subprocess
import time
import urllib.request

import pytest

from harness import Server, get_json, turn, wait_until
from storage import records, segments


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs where the write-ahead log lives (set up and torn down by the test)."""
    wal = tmp_path / "data" / "wal"
    wal.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(wal)], capture_output=True, text=True)
    assert proc.returncode == 0, f"this test mounts a tmpfs (it needs root): {proc.stderr}"
    yield wal
    subprocess.run(["umount", "-l", str(wal)], check=False)


def put(base, sid, key, payload):
    return get_json(f"{base}/v1/sessions/{sid}/checkpoints/{key}", method="PUT", body=payload)


def test_a_full_disk_fails_fast_with_507_and_recovers(small_disk, tmp_path):
    server = Server(tmp_path).start()
    filler = small_disk / "filler"
    try:
        for i in range(5):
            assert put(server.url, f"disk-{i}", "k", f"kept {i}".encode())[0] == 200
        with open(filler, "wb", buffering=0) as f:   # fill the disk to the last byte
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        started = time.monotonic()
        status, _, body = put(server.url, "disk-x", "k", b"x" * 4096)
        assert status == 507 and body["error"]["code"] == "insufficient_storage"
        assert time.monotonic() - started < 5
        for _ in range(50):  # use up the slack of the log's last page too (tmpfs allocates pages)
            if put(server.url, "disk-x", "k", b"x" * 100)[0] == 507:
                break
        # (a page freed elsewhere on the tmpfs may let one through)
        refused = sum(put(server.url, "disk-x", "k", b"x" * 100)[0] == 507 for _ in range(30))
        assert refused >= 20
        failed = turn(server.url, "disk-chat", "hello")
        assert failed.terminal == "turn.failed" and failed.data("turn.failed")["error"]["code"] == "disk_full"
        wait_until(lambda: "disk_full" in server.log(), 5, "the log line")

        filler.unlink()   # space comes back
        wait_until(lambda: put(server.url, "disk-x", "k", b"after")[0] == 200, 20, "writes to succeed again",
                   interval=0.3)
        for i in range(5):   # what was acknowledged before is all there
            with urllib.request.urlopen(f"{server.url}/v1/sessions/disk-{i}/checkpoints/latest") as resp:
                assert resp.read() == f"kept {i}".encode()
        assert turn(server.url, "disk-chat", "hello again").terminal == "turn.completed"
        # The log says the failures once (not one ERROR per refused write) and when they ended.
        failed_lines = [line for line in server.log().splitlines() if "log write of" in line and " ERROR " in line]
        assert 1 <= len(failed_lines) < refused, failed_lines
        wait_until(lambda: "log writes succeed again, after" in server.log(), 5, "the line saying the failures ended")
    finally:
        if filler.exists():
            os.unlink(filler)
        assert server.stop() == 0
    # The turn runs' journal records that nobody waits for (run.started, run.ended) were refused
    # with the failed turn's writes, and written once space came back: each once, in the log.
    journal = collections.Counter()
    for writer in small_disk.iterdir():
        for _, path in segments.list_segments(writer) if writer.is_dir() else ():
            for _, kind, _, body, _ in records.scan(path.read_bytes()):
                record = records.decode_body(body) if kind == records.RecordKind.FLOW else {}
                if record.get("run", "").startswith("disk-chat/"):
                    journal[record["run"], record["type"]] += 1
    runs = {run for run, _ in journal}
    assert len(runs) == 2, journal
    assert all(journal[run, kind] == 1 for run in runs for kind in ("run.started", "run.ended")), journal
