"""End-to-end: a log that has filled a segment keeps `storage.spare_segments` zeroed segments
ready while it is idle, a burst rotates into them, and a quiet log zeroes no more than its next."""
import time
import urllib.request

from bench import fsync_window
from harness import Server
from storage import segments

SEGMENT = 256 << 10


def _spares(directory) -> list[str]:
    return sorted(p.name for p in directory.glob("spare*.zero") if p.stat().st_size == SEGMENT)


def _put(url: str, sid: str, key: str, body: bytes) -> None:
    request = urllib.request.Request(f"{url}/v1/sessions/{sid}/checkpoints/{key}", data=body, method="PUT")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def test_an_idle_log_keeps_its_spares_ready_and_a_burst_takes_them(tmp_path):
    server = Server(tmp_path, {"storage": {"segment_bytes": SEGMENT, "spare_segments": 3}}).start()
    gateway_log = tmp_path / "data" / "wal" / "1"      # the gateway's own log takes the PUTs
    writer_log = tmp_path / "data" / "wal" / "0"
    try:
        body = lambda n: f"{n:04d};".encode() * 2400     # noqa: E731 - 12 KB: a segment holds about twenty
        for n in range(30):                             # more than a segment: the log has filled one
            _put(server.url, "sp", f"k{n}", body(n))
        deadline = time.monotonic() + 20
        while _spares(gateway_log) != ["spare.1.zero", "spare.2.zero", "spare.zero"]:
            assert time.monotonic() < deadline, f"spares never filled: {_spares(gateway_log)}"
            time.sleep(0.2)
        before = len(segments.list_segments(gateway_log))
        for n in range(30, 70):                         # a burst of about two segments
            _put(server.url, "sp", f"k{n}", body(n))
        assert len(segments.list_segments(gateway_log)) >= before + 1
        with urllib.request.urlopen(f"{server.url}/v1/sessions/sp/checkpoints/latest", timeout=10) as resp:
            assert (resp.headers["X-Checkpoint-Key"], resp.read()) == ("k69", body(69))
        assert len(_spares(writer_log)) <= 1            # writer/log never filled a segment: one at most
        # Idle again after the burst, the log refills what it took: the zeroings while idle
        # reach three (before the burst the next segment may have been zeroed ahead, not idle).
        deadline = time.monotonic() + 20
        while True:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as resp:
                zeroed = fsync_window.parse(resp.read().decode())["zeroed"]
            if zeroed.get("idle", 0) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert zeroed.get("idle", 0) >= 3 and zeroed.get("at_open", 0) >= 2, zeroed
        assert zeroed.get("at_rotation", 0) == 0, zeroed  # no batch waited for a segment to be zeroed
    finally:
        assert server.stop() == 0
    assert not list(gateway_log.glob("spare.zeroing"))   # a spare being zeroed at stop was dropped
    log_text = "\n".join(p.read_text() for p in tmp_path.rglob("*.log"))
    assert "writer/log" in log_text and " ERROR " not in log_text and "could not zero" not in log_text
