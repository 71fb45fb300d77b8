"""By hand: damaged records mended from the bucket at scale (not a benchmark, a check).

A node on a real S3 endpoint (moto), small segments and frequent compactions (so sealed segments
in the bucket are compaction objects too): checkpoints of many sessions, rewritten so most are
superseded and cut. Stopped; records flipped at random in its sealed segments; its DuckDB files
moved out; started again: writer/store's rebuild meets every damaged record and asks for it to
be mended. Then more damage, mended offline by `agent-os log mend`. Every session's latest
checkpoint must read back as last written, and `log check` must say whole.

Run from the repository: `.venv/bin/python bench/results/2026-12-05-mend-at-scale-fortythird/by-hand/mend_at_scale.py`
"""
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from bench.failover import latest_key, put          # noqa: E402
from bench.s3_local import CREDENTIALS, S3Server    # noqa: E402
from bench.server_proc import ServerProcess, deep_merge, wait_until   # noqa: E402
from storage import records, segments               # noqa: E402

SESSIONS, ROUNDS, DAMAGE = 200, 10, 40
rng = random.Random(int(os.environ.get("SEED", "7")))


def damage(wal: Path, count: int) -> list[tuple[str, int]]:
    """Flip a byte inside `count` random records of the sealed segments of every log."""
    candidates = []
    for log in sorted(p for p in wal.iterdir() if p.name.isdigit()):
        for start, path in segments.list_segments(log)[:-1]:
            for offset, kind, _, _, end in records.scan(path.read_bytes()):
                candidates.append((log, start, path, offset, end))
    picked = rng.sample(candidates, min(count, len(candidates)))
    for log, start, path, offset, end in picked:
        with open(path, "r+b") as f:
            f.seek(offset + rng.randrange(8, end - offset))
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
    return sorted((log.name, start + offset) for log, start, _, offset, _ in picked)


def whole_log(node) -> str:
    return node.log_path.read_text(errors="replace")     # node.log() is its tail


def covered(flipped: list, lines: list[str]) -> bool:
    """Every flipped position lies in a range some line says was mended (one mend covers records
    that are damaged one after another)."""
    ranges = []
    for line in lines:
        log, position = line.split()[1].rstrip(":"), int(line.split("position ")[1].split(":")[0])
        size = int(line.split("mended ")[1].split(" ")[0].replace(",", ""))
        ranges.append((log, position, position + size))
    return all(any(log == lg and lo <= at < hi for lg, lo, hi in ranges) for log, at in flipped)


def main() -> int:
    s3 = S3Server()
    bucket = s3.new_bucket()
    config = deep_merge(s3.storage_config(bucket, "s3"), {"storage": {"segment_bytes": 256 << 10,
                                                                      "compaction_interval_secs": 2}})
    work = Path(tempfile.mkdtemp(prefix="mend-scale-"))
    node = ServerProcess(work, config, env=CREDENTIALS)    # its data stays between its stops
    out = {"sessions": SESSIONS, "rounds": ROUNDS}
    try:
        node.start()
        latest = {}
        began = time.monotonic()
        for round_ in range(ROUNDS):
            for i in range(SESSIONS):
                state = os.urandom(rng.randrange(1000, 6000))
                assert put(node.url, f"scale-{i}", f"k{round_}", state) == 200
                latest[f"scale-{i}"] = state
        out["put_secs"] = round(time.monotonic() - began, 1)
        wait_until(lambda: "compaction: dropped" in node.log(), 60, "a compaction pass to cut checkpoints")
        time.sleep(6)      # a few more passes
        assert node.stop() == 0
        data = node.work_dir / "data"
        wal = data / "wal"
        out["segments"] = {p.name: len(segments.list_segments(p)) for p in wal.iterdir() if p.name.isdigit()}
        out["compacted"] = node.log().count("compaction: dropped")

        # 1. the rebuild mends what it meets
        inodes = {p.name: p.stat().st_ino for p in (wal / "1").glob("*.seg")}
        flipped = damage(wal, DAMAGE)
        out["flipped_first"] = len(flipped)
        out["check_before"] = node.cli("log", "check").returncode
        os.rename(data / "db", node.work_dir / "db-1")
        node.start(timeout=120)
        got = {sid: latest_key(node.url, sid) for sid in latest}
        out["latest_equal_after_rebuild"] = got == latest
        out["mended_by_store"] = whole_log(node).count("with the bucket's copy")
        out["not_mended"] = whole_log(node).count("could not mend")
        assert node.stop() == 0
        check = node.cli("log", "check")
        out["check_after_rebuild"] = check.returncode
        out["segments_replaced_during_rebuild"] = sorted(
            name for name, ino in inodes.items() if (wal / "1" / name).exists() and (wal / "1" / name).stat().st_ino != ino)
        out["check_after_rebuild_problems"] = [line for line in check.stdout.splitlines() if "segment " in line]
        out["first_flipped"] = flipped
        out["server_not_mended_lines"] = [line[:300] for line in whole_log(node).splitlines()
                                          if "could not mend" in line or "is damaged" in line]

        # 2. `log mend` with the server stopped
        flipped = damage(wal, DAMAGE)
        out["flipped_second"] = len(flipped)
        mended = node.cli("log", "mend", timeout=300)
        out["log_mend_rc"] = mended.returncode
        out["log_mend_lines"] = len(mended.stdout.splitlines())
        out["log_mend_not_mended"] = [line for line in mended.stdout.splitlines() if "not mended" in line]
        out["log_mend_covers_every_flip"] = covered(flipped, [line for line in mended.stdout.splitlines()
                                                              if ": mended " in line])
        check = node.cli("log", "check")
        out["check_after_mend"] = check.returncode
        out["kept_aside_files"] = check.stdout.count("kept aside: ")
        os.rename(data / "db", node.work_dir / "db-2")
        node.start(timeout=120)
        out["latest_equal_after_second_rebuild"] = {sid: latest_key(node.url, sid) for sid in latest} == latest
        out["damage_met_by_second_rebuild"] = whole_log(node).count("is damaged")
        assert node.stop() == 0
    finally:
        node.stop()
        s3.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(node.run_root, ignore_errors=True)
        print("work dir:", work, file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0 if out["latest_equal_after_rebuild"] and out["latest_equal_after_second_rebuild"] else 1


if __name__ == "__main__":
    sys.exit(main())
