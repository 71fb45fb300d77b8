"""By hand (bench/results/2026-12-05-shared-disk-floor-fortysixth/): the whole data directory (the
logs and DuckDB) on one tmpfs, filled by 12 KB checkpoint PUTs alternating a hot session and new
ones until both are refused; then whether the disk frees itself. Run from a clone's tests/ with
SIZE (tmpfs size), SEG (segment bytes), MIN_FREE (storage.min_free_bytes), OUT (a JSON-lines
file a row is appended to)."""
import json
import os
import threading
import time

from harness import Server, scrape
from test_e2e_full_disk import put, tmpfs


def test_shared_disk(tmp_path):
    size, seg, min_free = os.environ["SIZE"], int(os.environ["SEG"]), int(os.environ["MIN_FREE"])
    config = {"storage": {"segment_bytes": seg, "spare_segments": 1, "compaction_interval_secs": 1,
                          "min_free_bytes": min_free}}
    row = {"size": size, "segment_bytes": seg, "min_free_bytes": min_free, "samples": []}
    with tmpfs(tmp_path / "data", size):
        server = Server(tmp_path, config).start()
        began = time.monotonic()
        stop = threading.Event()

        def sample():
            while not stop.wait(0.25):
                try:
                    m = scrape(server.url)
                    row["samples"].append((round(time.monotonic() - began, 2), m.get('agentos_disk_free_bytes{volume="data"}'),
                                           m.get("agentos_store_lag_bytes")))
                except OSError:
                    pass
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            kept = 0
            for i in range(100_000):
                hot = put(server.url, "hot", "k", b"%06d" % i + b"h" * 12000)[0]
                cold = put(server.url, f"cold-{i}", "k", b"%06d" % i + b"c" * 12000)[0]
                kept += cold == 200
                if (hot, cold) == (507, 507):
                    break
            row["filled_after_secs"] = round(time.monotonic() - began, 2)
            row["kept"] = kept
            row["first_put_taken_after_secs"] = None
            t1 = time.monotonic()
            while time.monotonic() - t1 < 30:
                if put(server.url, "hot", "k", b"after" * 2400)[0] == 200:
                    row["first_put_taken_after_secs"] = round(time.monotonic() - t1, 2)
                    break
                time.sleep(0.5)
            time.sleep(3)
            row["taken_of_40_after_3s"] = [put(server.url, f"after-{n}", "k", b"a" * 12000)[0]
                                          for n in range(40)].count(200)
            m = scrape(server.url)
            row["end"] = {"free": m.get('agentos_disk_free_bytes{volume="data"}'), "store_lag_bytes": m.get("agentos_store_lag_bytes")}
        finally:
            stop.set()
            sampler.join()
            server.stop()
            row["warning_or_error_lines"] = sum(" ERROR " in l or " WARNING " in l for l in server.log().splitlines())
            with open(os.environ["OUT"], "a") as out:
                out.write(json.dumps(row) + "\n")
