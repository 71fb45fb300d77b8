"""By hand (bench/results/2026-12-05-shared-disk-failed-load-fortyeighth/): the whole data directory
(the logs and DuckDB) on a 12 MiB tmpfs; writer/store stopped (SIGSTOP) while 12 KB checkpoint
PUTs, alternating a hot session and new ones, fill it until both are refused; another file then
takes all but LEAVE MiB; the store goes on (SIGCONT). Then: when a hot PUT is taken again, the
free space and the payload segments' bytes every 0.5 s for 20 s, and how many of 20 new sessions'
PUTs are taken. Run from a clone's tests/ with LEAVE and OUT (a JSON-lines file a row is
appended to)."""
import json
import os
import signal
import time

from harness import Server
from test_e2e_full_disk import fill_with_checkpoints, put, tmpfs


def test_shared_disk_failed_load(tmp_path):
    leave = int(float(os.environ["LEAVE"]) * (1 << 20))
    config = {"storage": {"segment_bytes": 256 << 10, "spare_segments": 1, "compaction_interval_secs": 1}}
    row = {"size": "12m", "leave_mib": float(os.environ["LEAVE"]), "samples": []}
    with tmpfs(tmp_path / "data", "12m") as data:
        server = Server(tmp_path, config).start()
        store = server.pid("writer/store")
        try:
            os.kill(store, signal.SIGSTOP)
            try:
                row["kept"] = len(fill_with_checkpoints(server.url))
                disk = os.statvfs(data)
                row["free_after_fill"] = disk.f_bavail * disk.f_frsize
                with open(data / "other", "wb") as other:
                    other.write(b"\0" * (row["free_after_fill"] - leave))
                    os.fsync(other.fileno())
            finally:
                os.kill(store, signal.SIGCONT)
            began = time.monotonic()
            row["first_put_taken_after_secs"] = None
            while time.monotonic() - began < 20:
                disk = os.statvfs(data)
                payloads = sum(p.stat().st_blocks * 512 for p in (data / "db" / "payloads").iterdir())
                status = put(server.url, "hot", "k", b"after" * 2400)[0]
                row["samples"].append((round(time.monotonic() - began, 1), disk.f_bavail * disk.f_frsize, payloads, status))
                if status == 200 and row["first_put_taken_after_secs"] is None:
                    row["first_put_taken_after_secs"] = round(time.monotonic() - began, 2)
                time.sleep(0.5)
            row["taken_of_20"] = [put(server.url, f"after-{n}", "k", b"a" * 12000)[0] for n in range(20)].count(200)
        finally:
            server.stop()
            log = server.log()
            row["failed_loads_said"] = log.count("loading a batch into DuckDB")
            row["warning_or_error_lines"] = sum(" ERROR " in l or " WARNING " in l for l in log.splitlines())
            with open(os.environ["OUT"], "a") as out:
                out.write(json.dumps(row) + "\n")
