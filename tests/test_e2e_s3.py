"""End-to-end against a real S3 endpoint (moto's server, over HTTP): the log in the bucket, a
node rebuilt from it on an empty disk, a standby that takes over, and S3 outages
(the lease itself, fencing and a stalled supervisor: test_e2e_lease.py)."""
import collections
import json
import os
import re
import threading
import time

import duckdb

from harness import get_json, scrape, status_of, turn, wait_until
from bench.failover import latest_key as latest, put


def start_flow(base, flow, input):
    return get_json(f"{base}/v1/flows/{flow}/runs", method="POST", body=json.dumps({"input": input}).encode())[2]


def run_result(base, run_id, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = get_json(f"{base}/v1/runs/{run_id}?wait=5")[2]
        if body.get("status") in ("completed", "failed", "cancelled"):
            return body
    return body


def test_a_fresh_node_with_an_empty_disk_recovers_everything_from_the_bucket(make_s3_server, make_worker, s3,
                                                                             tmp_path):
    bucket = s3.new_bucket()
    a = make_s3_server(bucket, "a")
    make_worker(a)
    for i in range(10):
        assert put(a.url, f"fresh-{i}", "k", f"state {i}".encode()) == 200
    answer = turn(a.url, "fresh-chat", "remember this")
    assert answer.terminal == "turn.completed"
    assert turn(a.url, "fresh-closed", "forget this").terminal == "turn.completed"
    assert put(a.url, "fresh-closed", "k", b"closed state") == 200
    assert get_json(f"{a.url}/v1/sessions/fresh-closed", method="DELETE")[0] == 204
    run = start_flow(a.url, "five_steps", {"file": str(tmp_path / "fx"), "delay": 0.01})
    assert run_result(a.url, run["run_id"])["result"] == 100
    requests = 'agentos_s3_requests_total{{op="{}",purpose="{}"}}'
    counted = scrape(a.url)
    assert counted[requests.format("put", "wal")] >= 1
    assert counted[requests.format("put", "lease")] >= 1 and counted[requests.format("get", "lease")] >= 1
    assert a.stop() == 0
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.startswith("wal/000/") for k in keys) and "lease.json" in keys

    b = make_s3_server(bucket, "b")   # another data directory: empty
    counted = scrape(b.url)           # it listed the log's objects and read them back
    assert counted[requests.format("list", "recovery")] >= 1 and counted[requests.format("get", "recovery")] >= 1
    assert [latest(b.url, f"fresh-{i}") for i in range(10)] == [f"state {i}".encode() for i in range(10)]
    messages = get_json(f"{b.url}/v1/sessions/fresh-chat/messages")[2]["messages"]
    assert [m["content"] for m in messages] == ["remember this", answer.text]
    assert get_json(f"{b.url}/v1/sessions/fresh-closed/messages")[0] == 404   # its close came with the log
    assert status_of(f"{b.url}/v1/sessions/fresh-closed/checkpoints/latest") == 404
    body = get_json(f"{b.url}/v1/runs/{run['run_id']}")[2]
    assert body["status"] == "completed" and body["result"] == 100


def test_kill9_of_the_active_node_and_the_standby_takes_over(make_s3_server, make_worker, s3, tmp_path):
    bucket = s3.new_bucket()
    a = make_s3_server(bucket, "a")
    make_worker(a, slots=4)
    b = make_s3_server(bucket, "b", start=False, args=("--standby",))
    b.launch()
    wait_until(lambda: "standby: node" in b.log(), 20, "the standby to watch the lease")
    effects = tmp_path / "effects"
    run = start_flow(a.url, "five_steps", {"file": str(effects), "delay": 0.4})
    acked: list[tuple[str, str]] = []
    stop = threading.Event()

    def load():
        n = 0
        while not stop.is_set():
            key = f"k{n}"
            n += 1
            if put(a.url, f"fo-{n % 7}", key, key.encode(), timeout=5) == 200:
                acked.append((f"fo-{n % 7}", key))

    loader = threading.Thread(target=load)
    loader.start()
    wait_until(lambda: len(acked) >= 30 and "step 1" in (effects.read_text() if effects.exists() else ""), 30,
               "load and flow progress")
    killed_at = time.monotonic()
    a.crash()
    stop.set()
    loader.join()
    b.wait_ready(60)
    failover = time.monotonic() - killed_at
    print(f"failover: standby serving {failover:.1f}s after kill -9 (lease ttl 3s)")
    assert failover < 3.0 + 20.0
    make_worker(b, slots=4)
    body = run_result(b.url, run["run_id"])
    assert body["status"] == "completed" and body["result"] == 100
    # Committed steps never ran again; only the one in flight at the kill may have run twice.
    seen = collections.Counter(effects.read_text().splitlines())
    starts = (tmp_path / "effects.starts").read_text()
    assert set(seen) == {f"step {n}" for n in range(5)} and sum(seen.values()) <= 6, (seen, starts)
    latest_acked = {}
    for sid, key in acked:
        latest_acked[sid] = key
    for sid, key in latest_acked.items():
        # The latest may be newer than the last acknowledged (durable, its ack lost with A), never older.
        assert int(latest(b.url, sid).decode()[1:]) >= int(key[1:])
    assert b.stop() == 0
    with duckdb.connect(str(tmp_path / "b" / "data" / "db" / "messages.db"), read_only=True) as con:
        rows = collections.Counter(con.execute("SELECT session, key FROM checkpoints WHERE kind = 'blob'").fetchall())
    assert all(rows[k] == 1 for k in acked), [k for k in acked if rows[k] != 1][:5]


def test_s3_outage_holds_s3_acks_and_local_mode_goes_on(make_s3_server, s3):
    # The lease outlives the outage by far: this test is about acks, not about losing the lease
    # (on a loaded machine a 3 s lease could lapse during a 2.5 s outage).
    lasting = {"cluster": {"lease_ttl_secs": 15.0}}
    node = make_s3_server(s3.new_bucket(), "s3mode", lasting)
    assert put(node.url, "outage", "before", b"before") == 200
    s3.proxy.set("503")
    results = {}
    writer = threading.Thread(target=lambda: results.update(status=put(node.url, "outage", "during", b"during",
                                                                       timeout=60)))
    writer.start()
    time.sleep(2.5)
    assert "status" not in results   # no acknowledgement while the bucket refuses the PUT
    s3.proxy.set("up")
    writer.join(60)
    assert results["status"] == 200
    assert latest(node.url, "outage") == b"during"
    assert "object storage unavailable" in node.log() and "object storage is back" in node.log()

    local = make_s3_server(s3.new_bucket(), "localmode", lasting, durability="local")
    s3.proxy.set("refuse")
    try:
        started = time.monotonic()
        assert turn(local.url, "outage-local", "still working?").terminal == "turn.completed"
        assert put(local.url, "outage-local", "k", b"local") == 200
        assert time.monotonic() - started < 10
    finally:
        s3.proxy.set("up")

    def shipped():
        data = json.loads(local.cli("status", "--json").stdout)
        writer = next(p for p in data["processes"] if p["name"] == "writer/log/0")["stats"]
        return writer["s3"]["shipped"] == writer["end"] and not writer["s3"]["failing"]
    wait_until(shipped, 30, "the local-mode node to ship what it wrote during the outage", interval=0.3)


def test_retention_removes_closed_runs_from_the_log_the_bucket_and_duckdb(make_s3_server, make_worker, s3,
                                                                         tmp_path):
    from storage import compaction, records, segments
    bucket = s3.new_bucket()
    node = make_s3_server(bucket, "retention", {"storage": {"retention_secs": 1, "compaction_interval_secs": 1,
                                                            "segment_bytes": 4096}}, durability="local")
    make_worker(node)
    closed = [start_flow(node.url, "async_steps", 3)["run_id"] for _ in range(5)]
    for run_id in closed:
        assert run_result(node.url, run_id)["status"] == "completed"
    open_run = start_flow(node.url, "waiter", {})["run_id"]
    # Runs journal to writer/log/0 and a closed run leaves only once its last record is in a sealed
    # segment: later runs fill the one being written until it rotates.
    journal = tmp_path / "retention" / "data" / "wal" / "0"
    written = len(segments.list_segments(journal))
    for _ in range(40):
        if len(segments.list_segments(journal)) > written:
            break
        assert run_result(node.url, start_flow(node.url, "async_steps", 3)["run_id"])["status"] == "completed"
    assert len(segments.list_segments(journal)) > written
    for i in range(12):  # enough checkpoints to seal a few 4 KiB segments of the gateway's log
        assert put(node.url, "retention-filler", f"k{i}", os.urandom(1500)) == 200
    wait_until(lambda: "retention: dropped" in node.log(), 30, "a compaction pass to drop the closed runs",
               interval=0.3)
    wait_until(lambda: all(get_json(f"{node.url}/v1/runs/{r}")[0] == 404 for r in closed), 90,
               "the closed runs to be gone", interval=0.5)
    for message in ("one", "two"):
        get_json(f"{node.url}/v1/runs/{open_run}/channels/inbox", method="POST",
                 body=json.dumps({"message": message}).encode())
    assert run_result(node.url, open_run)["result"] == ["one", "two"]   # an open run is untouched

    # the same passes drop the superseded filler checkpoints, from the bucket's copy too, and the
    # access rows of segments older than the window from the gateway's log and from access.db
    wait_until(lambda: "compaction: dropped" in node.log(), 30, "superseded checkpoints to leave the log",
               interval=0.3)
    wait_until(lambda: "access records from the log" in node.log() and "access rows from before" in node.log(), 30,
               "access rows past the window to leave the log and DuckDB", interval=0.3)
    # A row can reach DuckDB after the pass that would have taken it: once the store has loaded
    # every row so far (a read with `sync` returns only then), a later pass takes every row older
    # than the window. The requests that wait for it add newer rows, the ones each log keeps.
    time.sleep(0.1)   # the gateway appends access rows 20 ms after their request
    caught_up = time.time()
    get_json(f"{node.url}/v1/sessions/retention-filler/messages")
    wait_until(lambda: get_json(f"{node.url}/healthz") and max(float(b) for b in re.findall(
        r"removed \d+ access rows from before ([0-9.]+)", node.log())) > caught_up, 30,
        "a retention pass after that", interval=0.3)
    time.sleep(3)     # no new requests: the passes finish with the segments sealed so far

    def runs_in(data: bytes) -> set[str]:
        return {records.decode_body(body).get("run") for _, kind, _, body, _ in records.scan(data)
                if kind == records.RecordKind.FLOW}

    assert node.stop() == 0   # no pass rewrites the bucket's objects while we read them
    client = s3.client()
    in_bucket = set()
    fillers = 0
    for obj in client.list_objects_v2(Bucket=bucket, Prefix="wal/")["Contents"]:
        data = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        in_bucket |= runs_in(data)
        fillers += sum(kind == records.RecordKind.BLOB for _, kind, _, _, _ in records.scan(data))
    assert 1 <= fillers < 12
    local = set()
    for _, path in segments.list_segments(journal):
        local |= runs_in(path.read_bytes())
    assert not in_bucket & set(closed) and not local & set(closed)
    assert open_run in in_bucket
    with duckdb.connect(str(tmp_path / "retention" / "data" / "db" / "flows.db"), read_only=True) as con:
        left = con.execute("SELECT count(*) FROM flow_records WHERE run IN (SELECT unnest(?))", [closed]).fetchone()[0]
    assert left == 0

    def access_records(data: bytes) -> int:
        return sum(kind == records.RecordKind.ACCESS for _, kind, _, _, _ in records.scan(data))

    gateway_log = tmp_path / "retention" / "data" / "wal" / "1"
    mark = compaction.read_mark(gateway_log, compaction.ACCESS_MARK_FILE)
    local = {start: access_records(path.read_bytes()) for start, path in segments.list_segments(gateway_log)}
    assert mark > 0 and sum(local.values()) > 0
    assert all(count == 0 for start, count in local.items() if start < mark)
    in_bucket = sum(access_records(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
                    for obj in client.list_objects_v2(Bucket=bucket, Prefix="wal/001/")["Contents"])
    assert in_bucket <= sum(local.values())     # the bucket's copies were rewritten too
    with duckdb.connect(str(tmp_path / "retention" / "data" / "db" / "access.db"), read_only=True) as con:
        # every row older than the window went but each log's newest record (the file's progress),
        # and the newest is recent: the /metrics reads kept adding rows
        assert con.execute("SELECT count(*) FROM access WHERE ts < ?", [caught_up - 5]).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM access").fetchone()[0] > 0


def test_a_damaged_record_in_the_newest_segment_comes_back_from_the_bucket(make_s3_server, s3, tmp_path):
    """A byte flipped on the local disk in an acknowledged checkpoint: the restarted node keeps the
    bytes aside, clears them, and writes them back from the bucket's copy of the log, so every
    checkpoint reads back and the log checks whole."""
    from storage import records, segments
    bucket = s3.new_bucket()
    node = make_s3_server(bucket, "a")
    for i in range(10):
        assert put(node.url, f"heal-{i}", "k", f"state {i}".encode()) == 200
    assert node.stop() == 0
    gateway_log = tmp_path / "a" / "data" / "wal" / "1"       # the gateway's own log holds the PUTs
    (start, newest), = segments.list_segments(gateway_log)[-1:]
    data = bytearray(newest.read_bytes())
    first = next(r for r in records.scan(bytes(data)) if r[1] == records.RecordKind.BLOB)
    data[first[0] + 20] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert node.cli("log", "check").returncode == 1     # damage: whole records follow it

    node = make_s3_server(bucket, "a")
    assert re.search(r"restored \d+ bytes of log 1 from the bucket", node.log()), node.log()[-2000:]
    assert [latest(node.url, f"heal-{i}") for i in range(10)] == [f"state {i}".encode() for i in range(10)]
    assert node.stop() == 0
    check = node.cli("log", "check")
    assert check.returncode == 0 and "ok: every record whole" in check.stdout, check.stdout
    assert f"kept aside: {newest.name}.damaged-{start + first[0]}" in check.stdout, check.stdout


def node_with_sealed_segments(make_s3_server, s3):
    """A node whose gateway log holds 30 checkpoints of 6 KB in segments of 64 KiB (two sealed, at
    least): (bucket, config, node, the states by session)."""
    bucket = s3.new_bucket()
    config = {"storage": {"segment_bytes": 64 << 10}}
    node = make_s3_server(bucket, "a", config)
    states = {f"mend-{i}": os.urandom(6000) for i in range(30)}
    for sid, state in states.items():
        assert put(node.url, sid, "k", state) == 200
    return bucket, config, node, states


def test_a_damaged_record_in_a_sealed_segment_is_mended_from_the_bucket(make_s3_server, s3, tmp_path):
    """A byte flipped on the local disk in a sealed segment of acknowledged checkpoints, found
    when writer/store reads the log again (its DuckDB files moved out to be rebuilt): the log's
    writer writes the bucket's copy over the damage, so every checkpoint loads and reads back,
    and the log checks whole. Before, the store passed over the damaged record: its checkpoint was
    gone from what the server answers."""
    from storage import records, segments
    bucket, config, node, states = node_with_sealed_segments(make_s3_server, s3)
    assert node.stop() == 0
    gateway_log = tmp_path / "a" / "data" / "wal" / "1"       # the gateway's own log holds the PUTs
    sealed = segments.list_segments(gateway_log)[:-1]
    assert len(sealed) >= 2, sealed
    start, path = sealed[1]
    data = bytearray(path.read_bytes())
    blobs = [r for r in records.scan(bytes(data)) if r[1] == records.RecordKind.BLOB]
    damaged = blobs[len(blobs) // 2]
    data[damaged[0] + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    assert node.cli("log", "check").returncode == 1
    os.rename(tmp_path / "a" / "data" / "db", tmp_path / "a" / "db-before")

    node = make_s3_server(bucket, "a", config)
    assert {sid: latest(node.url, sid) for sid in states} == states
    mended = f"mended {damaged[4] - damaged[0]} damaged bytes at position {start + damaged[0]}"
    wait_until(lambda: mended in node.log(), 10, "the writer's line saying it mended the record")
    counted = scrape(node.url)
    assert counted.get('agentos_log_damaged_records_total{outcome="mended"}') == 1, counted
    assert 'agentos_log_damaged_records_total{outcome="skipped"}' not in counted
    assert node.stop() == 0
    check = node.cli("log", "check")
    assert check.returncode == 0 and "ok: every record whole" in check.stdout, check.stdout
    assert f"kept aside: {path.name}.damaged-{start + damaged[0]}" in check.stdout, check.stdout


def test_log_mend_writes_the_buckets_copy_over_damaged_records_with_the_server_stopped(make_s3_server, s3,
                                                                                       tmp_path):
    """What `log check` reports as damage, `log mend` mends from the bucket: while the server runs
    it refuses (the server's readers mend what they meet), once it is stopped every damaged record
    is written over with the bucket's copy and the log checks whole."""
    from storage import records, segments
    bucket, config, node, states = node_with_sealed_segments(make_s3_server, s3)
    running = node.cli("log", "mend")
    assert running.returncode == 2 and "stop it first" in running.stderr, running.stderr
    assert node.stop() == 0
    gateway_log = tmp_path / "a" / "data" / "wal" / "1"
    damaged = []
    assert len(segments.list_segments(gateway_log)) >= 3
    for start, path in segments.list_segments(gateway_log)[:2]:     # two records in each of two sealed ones
        data = bytearray(path.read_bytes())
        blobs = [r for r in records.scan(bytes(data)) if r[1] == records.RecordKind.BLOB]
        for record in (blobs[1], blobs[-2]):
            data[record[0] + 20] ^= 0xFF
            damaged.append(start + record[0])
        path.write_bytes(bytes(data))
    assert node.cli("log", "check").returncode == 1

    mended = node.cli("log", "mend")
    assert mended.returncode == 0, mended.stdout + mended.stderr
    assert [int(line.split("position ")[1].split(":")[0]) for line in mended.stdout.splitlines()] == damaged
    check = node.cli("log", "check")
    assert check.returncode == 0 and "ok: every record whole" in check.stdout, check.stdout
    assert check.stdout.count("kept aside: ") == len(damaged)
    again = node.cli("log", "mend")
    assert again.returncode == 0 and again.stdout == "", again.stdout
    os.rename(tmp_path / "a" / "data" / "db", tmp_path / "a" / "db-before")   # the store loads it all again
    node = make_s3_server(bucket, "a", config)
    assert {sid: latest(node.url, sid) for sid in states} == states
    assert "damaged" not in node.log()
