"""`agent-os bench failover`: kill -9 the active node under checkpoint load while a standby watches
the lease; how long until the standby serves, and whether every acknowledged checkpoint is there.

Per run, against a fresh bucket on moto's S3 server (loopback):
- node A serves with `storage.durability: s3`; node B runs `agent-os serve --standby` on its own,
  empty data directory;
- threads PUT checkpoints to A (each acknowledged key remembered) for `--load-secs` plus a random
  part of a lease renewal period, so the kill falls anywhere between two renewals;
- A's whole process tree is killed with SIGKILL, under that load;
- failover: seconds from the kill to B's `/readyz` answering 200, split at the moment B's log
  says it took the lease (waiting for the lease to expire, then rebuilding from the bucket);
- then every session's latest checkpoint on B is checked against the newest key acknowledged by
  A (never older), and B's DuckDB must hold each acknowledged key exactly once.
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agentos.config import ClusterConfig
from bench.results import ResultsDir, markdown_table, pyplot
from bench.server_proc import ServerProcess, wait_until

SESSIONS = 16
TAKEOVER = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*took over the cluster lease")


def put(url: str, sid: str, key: str, body: bytes, timeout: float = 30.0) -> int | None:
    """PUT a checkpoint; its HTTP status, or None if there was no answer."""
    req = urllib.request.Request(f"{url}/v1/sessions/{sid}/checkpoints/{key}", data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def latest_key(url: str, sid: str) -> bytes:
    with urllib.request.urlopen(f"{url}/v1/sessions/{sid}/checkpoints/latest", timeout=30) as resp:
        return resp.read()


def takeover_time(log_text: str) -> float | None:
    """UNIX time of the standby's "took over the cluster lease" line (its log's local time)."""
    for line in log_text.splitlines():
        match = TAKEOVER.match(line)
        if match:
            return _dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


class Load:
    """Threads PUTting checkpoints to a node; `acked` holds every (session, n) it acknowledged."""

    def __init__(self, url: str, threads: int) -> None:
        self.url = url
        self.acked: list[tuple[str, int]] = []
        self.stopping = threading.Event()
        self.counter = iter(range(10 ** 9))
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        body = os.urandom(4096)
        while not self.stopping.is_set():
            with self.lock:
                n = next(self.counter)
            sid = f"fo-{n % SESSIONS}"
            # the key carries n, so the payload (and the key) tell which write a node kept
            if put(self.url, sid, f"k{n}", b"%d:" % n + body, timeout=5.0) == 200:
                with self.lock:
                    self.acked.append((sid, n))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(10)


def count_checkpoints(db: Path) -> collections.Counter:
    import duckdb
    with duckdb.connect(str(db), read_only=True) as con:
        return collections.Counter(con.execute("SELECT session, key FROM checkpoints WHERE kind = 'blob'").fetchall())


def newest_kept(rows: collections.Counter) -> dict[str, int]:
    """Session -> the newest `k<n>` the node has. Compaction drops the checkpoints older than a
    session's newest, so an acknowledged one below it is not lost."""
    newest: dict[str, int] = {}
    for sid, key in rows:
        if key[1:].isdigit():
            newest[sid] = max(newest.get(sid, -1), int(key[1:]))
    return newest


def one_run(index: int, s3, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.s3_local import CREDENTIALS
    config = s3.storage_config(s3.new_bucket(), direct=True)
    config["cluster"] = {"lease_renew_secs": args.lease_renew_secs, "lease_ttl_secs": args.lease_ttl_secs}
    a = ServerProcess(work / f"a-{index}", config, CREDENTIALS)
    b = ServerProcess(work / f"b-{index}", config, CREDENTIALS)
    b.args = ("--standby",)
    try:
        a.start()
        b.launch()
        wait_until(lambda: "standby: node" in b.log(), 60, "the standby to watch the lease")
        # a random extra wait, so the kill falls anywhere between two lease renewals
        loaded = args.load_secs + random.uniform(0.0, args.lease_renew_secs)
        with Load(a.url, args.threads) as load:
            time.sleep(loaded)
            killed_at = time.time()
            a.crash()
        acked = list(load.acked)
        b.wait_ready(args.lease_ttl_secs + 120)
        serving_at = time.time()
        took = takeover_time(b.log())
        newest: dict[str, int] = {}
        for sid, n in acked:
            newest[sid] = max(n, newest.get(sid, -1))
        older = [sid for sid, n in newest.items() if int(latest_key(b.url, sid).split(b":")[0]) < n]
        b.stop()
        rows = count_checkpoints(b.work_dir / "data" / "db" / "messages.db")
        kept = newest_kept(rows)
        missing = sum(1 for sid, n in acked if rows[(sid, f"k{n}")] == 0 and kept.get(sid, -1) <= n)
        doubled = sum(1 for sid, n in acked if rows[(sid, f"k{n}")] > 1)
        row = {"run": index + 1, "load_secs": round(loaded, 2), "acked": len(acked), "failover_secs": round(serving_at - killed_at, 2),
               "lease_wait_secs": round(took - killed_at, 2) if took else None,
               "rebuild_secs": round(serving_at - took, 2) if took else None,
               "sessions_older_than_acked": len(older), "acked_missing": missing, "acked_twice": doubled,
               "lease_renew_secs": args.lease_renew_secs, "lease_ttl_secs": args.lease_ttl_secs}
        print(f"  run {index + 1}: {len(acked)} acknowledged, standby serving {row['failover_secs']} s after the "
              f"kill (lease {row['lease_wait_secs']} s + rebuild {row['rebuild_secs']} s); missing {missing}, "
              f"twice {doubled}, older {len(older)}", file=sys.stderr)
        return row
    finally:
        b.stop()
        a.stop()


def write_report(results: ResultsDir, rows: list[dict], args: argparse.Namespace) -> None:
    failovers = [r["failover_secs"] for r in rows]
    text = (f"# Failover\n\nkill -9 of the active node's whole tree under checkpoint load ({args.threads} "
            f"threads PUTting 4 KB checkpoints to {SESSIONS} sessions for {args.load_secs:g} s plus a random part "
            f"of {args.lease_renew_secs:g} s), a standby "
            f"(`agent-os serve --standby`, empty data directory) watching the lease; `storage.durability: s3` "
            f"on moto's S3 server on loopback; lease renewed every {args.lease_renew_secs:g} s, TTL "
            f"{args.lease_ttl_secs:g} s. Failover: from the kill to the standby's /readyz answering 200, split "
            "at the line in the standby's log saying it took the lease.\n\n")
    text += markdown_table(
        ["run", "load s", "acknowledged", "failover s", "lease wait s", "rebuild s", "acked missing", "acked twice",
         "sessions older than acked"],
        [[r["run"], r.get("load_secs"), r["acked"], r["failover_secs"], r["lease_wait_secs"], r["rebuild_secs"], r["acked_missing"],
          r["acked_twice"], r["sessions_older_than_acked"]] for r in rows])
    text += (f"\n\nMedian failover {statistics.median(failovers):.2f} s (min {min(failovers):.2f}, max "
             f"{max(failovers):.2f}); target: within the lease TTL ({args.lease_ttl_secs:g} s) plus recovery.\n")
    results.write_summary(text)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["run"] for r in rows]
    ax.bar(xs, [r["lease_wait_secs"] or 0 for r in rows], label="waiting for the lease")
    ax.bar(xs, [r["rebuild_secs"] or 0 for r in rows], bottom=[r["lease_wait_secs"] or 0 for r in rows],
           label="rebuilding and starting")
    ax.axhline(args.lease_ttl_secs, color="grey", linestyle=":", label="lease TTL")
    ax.set_xlabel("run")
    ax.set_ylabel("seconds from kill -9 to serving")
    ax.legend()
    fig.tight_layout()
    fig.savefig(results.figure_path("failover.png"), dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = ClusterConfig()
    p = argparse.ArgumentParser(prog="agent-os bench failover", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--load-secs", type=float, default=5.0, help="checkpoint load before the kill")
    p.add_argument("--threads", type=int, default=4, help="threads PUTting checkpoints")
    p.add_argument("--lease-renew-secs", type=float, default=defaults.lease_renew_secs)
    p.add_argument("--lease-ttl-secs", type=float, default=defaults.lease_ttl_secs)
    p.add_argument("--name", default="failover")
    p.add_argument("--results-root", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.s3_local import S3Server
    args = parse_args(argv)
    results = ResultsDir(args.name, Path(args.results_root) if args.results_root else None)
    results.write_config({"command": "bench failover", "args": vars(args)})
    (results.path / "rows.jsonl").unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    s3 = S3Server()
    rows = []
    try:
        for i in range(args.runs):
            row = one_run(i, s3, args, work)
            rows.append(row)
            results.append_row(row)
    finally:
        s3.stop()
    write_report(results, rows, args)
    print(f"results: {results.path}", file=sys.stderr)
    lost = sum(r["acked_missing"] + r["acked_twice"] + r["sessions_older_than_acked"] for r in rows)
    if lost:   # the nodes' data directories, to look into
        print(f"kept the nodes' data directories in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
