"""What a long log's segment count costs its readers: the listing re-read on every call vs kept.

Owns: logs of N small segments built in a scratch directory (real frames, files named as
writer/log names them), and three measurements on each, side by side with the listing read from
the disk on every call (`segment_listing.forget` before each: what every call cost before the
listing was kept) and with it kept while the directory does not change:
- `list`: one listing, p50 over LIST_CALLS calls; `sealed`: compaction's list of sealed segments
  (several per pass, on the log writer's loop), likewise;
- `tail`: writer/store's loader in steady state — one batch appended to the last segment, then
  read; p50 per read;
- `catch-up`: a reader from position 0 over the whole log in reads of 8 MB, as writer/store after
  a restart; stopped after `--budget` seconds, so the rows say how far it had read by then.
Never does: start a server (it times the functions the store's loader calls).

    python -m bench.segment_count [--counts 1000,10000,30000] [--budget 20] [--name NAME]
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.results import ResultsDir, markdown_table, pyplot
from storage import records, segment_listing, segments
from storage.compaction import sealed_segments
from storage.records import RecordKind

RECORDS_PER_SEGMENT = 2
RECORD_BODY = b"x" * 200
LIST_CALLS = 30
READ_BYTES = 8 << 20     # what writer/store's loader asks a read for (storage/store.py)
TAIL_READS = 50


def build(directory: Path, count: int) -> int:
    """`count` segments of RECORDS_PER_SEGMENT records each; returns where the log ends."""
    directory.mkdir(parents=True)
    position = 0
    for n in range(count):
        data = b"".join(records.frame(RecordKind.EVENT, f"{n}-{i}".encode(), RECORD_BODY)
                        for i in range(RECORDS_PER_SEGMENT))
        (directory / segments.segment_name(position)).write_bytes(data)
        position += len(data)
    return position


def _listing_before(directory: Path) -> list:
    """The listing as every call made it before it was kept (a glob), for its cost beside ours."""
    out = []
    for path in directory.glob(f"*{segment_listing.SUFFIX}"):
        try:
            out.append((int(path.name[:-len(segment_listing.SUFFIX)]), path))
        except ValueError:
            continue
    return sorted(out)


def _age(directory: Path) -> None:
    # built seconds ago in a real log: a listing right after building would be racy (not kept)
    then = time.time() - 60
    os.utime(directory, (then, then))


def measure(directory: Path, count: int, kept: bool, budget: float) -> dict:
    def listing_call() -> None:
        if not kept:
            segment_listing.forget(directory)

    _age(directory)
    segment_listing.forget(directory)
    times = []
    for _ in range(LIST_CALLS):
        listing_call()
        t = time.perf_counter()
        segments.list_segments(directory)
        times.append(time.perf_counter() - t)
    list_ms = statistics.median(times) * 1000
    times = []
    for _ in range(LIST_CALLS):
        listing_call()
        t = time.perf_counter()
        sealed_segments(directory)
        times.append(time.perf_counter() - t)
    sealed_ms = statistics.median(times) * 1000
    globbed = []
    for _ in range(5 if not kept else 0):
        t = time.perf_counter()
        _listing_before(directory)
        globbed.append(time.perf_counter() - t)

    # catch-up from position 0
    reader = segments.SegmentReader(directory, 0)
    reads, read_records, finished = 0, 0, False
    started = time.perf_counter()
    deadline = started + budget
    while time.perf_counter() < deadline:
        listing_call()
        got = reader.read(READ_BYTES)
        if not got:
            finished = True
            break
        reads += 1
        read_records += len(got)
    catch_up_secs = time.perf_counter() - started

    # the tail: one small batch appended to the last segment before each read
    start, last = segments.list_segments(directory)[-1]
    tail = segments.SegmentReader(directory, start + last.stat().st_size)
    times = []
    with open(last, "ab") as f:
        for i in range(TAIL_READS):
            f.write(records.frame(RecordKind.EVENT, f"tail-{kept}-{i}".encode(), RECORD_BODY))
            f.flush()
            listing_call()
            t = time.perf_counter()
            got = tail.read(1 << 20)
            times.append(time.perf_counter() - t)
            if len(got) != 1:
                raise RuntimeError(f"the tail read found {len(got)} records, not 1")
    return {"segments": count, "listing": "kept" if kept else "every call", "list_ms": round(list_ms, 3),
            "glob_list_ms": round(statistics.median(globbed) * 1000, 3) if globbed else None,
            "sealed_ms": round(sealed_ms, 3),
            "tail_read_ms": round(statistics.median(times) * 1000, 3),
            "catch_up_secs": round(catch_up_secs, 2), "catch_up_reads": reads, "catch_up_records": read_records,
            "catch_up_finished": finished,
            "catch_up_segments_per_sec": round(read_records / RECORDS_PER_SEGMENT / catch_up_secs, 1)}


def summary(rows: list[dict], config: dict) -> str:
    table = markdown_table(
        ["segments", "listing", "one listing ms", "old glob listing ms", "sealed segments ms", "tail read ms (p50)",
         "catch-up: reads", "records", "in s", "segments/s", "finished"],
        [(r["segments"], r["listing"], r["list_ms"], r["glob_list_ms"], r["sealed_ms"], r["tail_read_ms"], r["catch_up_reads"], r["catch_up_records"],
          r["catch_up_secs"], r["catch_up_segments_per_sec"], "yes" if r["catch_up_finished"] else "no")
         for r in rows])
    return (f"# What a log's segment count costs its readers\n\n"
            f"Logs of N segments ({RECORDS_PER_SEGMENT} records of {len(RECORD_BODY)} bytes each) in "
            f"{config['directory_device']}. `every call`: the listing read from the disk on each call, as "
            f"before it was kept; `kept`: read once per change of the directory "
            f"(storage/segment_listing.py). `tail read`: one record appended, then read, as writer/store's "
            f"loader does in steady state (p50 of {TAIL_READS}); catch-up: a reader from position 0 in "
            f"reads of 8 MB, stopped after {config['budget_secs']} s. `old glob listing`: the listing as "
            f"the code before made it, timed on the same directory (p50 of 5). `sealed segments`: "
            f"compaction's list of them, asked for several times a pass on the log writer's loop "
            f"(p50 of {LIST_CALLS}).\n\n{table}\n")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in ("every call", "kept"):
        mine = [r for r in rows if r["listing"] == mode]
        ax.plot([r["segments"] for r in mine], [r["tail_read_ms"] for r in mine], marker="o", label=mode)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("segments in the log")
    ax.set_ylabel("tail read p50 (ms)")
    ax.set_title("writer/store's read of the newest record")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.segment_count", description=__doc__.split("\n")[0])
    p.add_argument("--counts", default="1000,10000,30000", help="segment counts, comma-separated")
    p.add_argument("--budget", type=float, default=20.0, help="seconds a catch-up read may take")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--name", default="segment-count", help="results folder name")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-segments-", dir=args.dir))
    from bench.disk_floor import device_of
    config = {"counts": counts, "budget_secs": args.budget, "command": " ".join(["python -m bench.segment_count", *(argv if argv is not None else sys.argv[1:])]),
              "directory_device": device_of(scratch).get("source", str(scratch)),
              "started_at": datetime.datetime.now().isoformat(timespec="seconds")}
    rows = []
    try:
        for count in counts:
            directory = scratch / str(count)
            build(directory, count)
            for kept in (False, True):
                row = measure(directory, count, kept, args.budget)
                print(row, flush=True)
                rows.append(row)
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = ResultsDir(args.name)
    results.write_config(config)
    results.write_rows(rows)
    results.write_summary(summary(rows, config))
    plot(rows, results.figure_path("tail_read.png"))
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
