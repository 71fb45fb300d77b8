"""How many bytes reach the disk per append + fdatasync into a segment zeroed with writes of a
given size (the page cache keeps the folio size a write created). Run from the repository root:
    .venv/bin/python bench/results/2026-12-01-zeroing-write-amplification/measure.py DIR
Prints one JSON row per (zeroing write size, append size, round)."""
import json
import os
import sys
import time

SEGMENT = 64 << 20
COMMITS = 300


def io() -> dict:
    out = {}
    for line in open("/proc/self/io"):
        key, value = line.split(":")
        out[key] = int(value)
    return out


def main(directory: str) -> None:
    path = os.path.join(directory, "zeroing-probe.seg")
    for rnd in (1, 2):
        for zero_write in (1 << 20, 64 << 10, 16 << 10, 4 << 10):
            for append in (22528, 220000):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                zeros = bytes(zero_write)
                for done in range(0, SEGMENT, zero_write):
                    os.write(fd, zeros)
                    if (done + zero_write) % (1 << 20) == 0:
                        os.fdatasync(fd)
                data, at, lat = os.urandom(append), 0, []
                before = io()
                for _ in range(COMMITS):
                    t = time.perf_counter()
                    os.pwrite(fd, data, at)
                    os.fdatasync(fd)
                    lat.append((time.perf_counter() - t) * 1000)
                    at += append
                after = io()
                os.close(fd)
                lat.sort()
                print(json.dumps({"round": rnd, "zero_write_bytes": zero_write, "append_bytes": append,
                                  "commits": COMMITS,
                                  "written_per_appended": round((after["write_bytes"] - before["write_bytes"]) / at, 2),
                                  "read_bytes": after["read_bytes"] - before["read_bytes"],
                                  "p50_ms": round(lat[COMMITS // 2], 3), "p99_ms": round(lat[int(COMMITS * 0.99)], 3)}),
                      flush=True)
    os.unlink(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
