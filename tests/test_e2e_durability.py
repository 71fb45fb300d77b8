"""End-to-end: what was acknowledged survives kill -9 of the writers and of the whole tree,
exactly once; the log recovers from a torn tail; sessions come back whole."""
import asyncio
import collections
import os
import time
from pathlib import Path

import aiohttp
import duckdb
import orjson

from broker.sharding import shard_of
from harness import REPO, Server, get_json, launch_python, run_turn, scrape, turn, wait_until
from storage import records, segments
from storage.records import RecordKind


def put(base, sid, key, payload: bytes):
    return get_json(f"{base}/v1/sessions/{sid}/checkpoints/{key}", method="PUT", body=payload,
                    headers={"Content-Type": "application/octet-stream"})


def test_transcript_and_events_endpoints_return_what_the_turns_produced(shared_server):
    turns = [turn(shared_server.url, "dur-history", text) for text in ("first question", "second question")]
    assert [t.terminal for t in turns] == ["turn.completed"] * 2
    status, _, body = get_json(f"{shared_server.url}/v1/sessions/dur-history/messages")
    assert status == 200
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("user", "first question"), ("assistant", turns[0].text), ("user", "second question"),
        ("assistant", turns[1].text)]
    assert [m["index"] for m in body["messages"]] == [0, 1, 2, 3]
    status, _, page = get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?after=1&limit=1")
    assert [m["index"] for m in page["messages"]] == [2] and page["next_after"] == 2
    # newest first, as a chat opens on its last messages, then the page before
    status, _, newest = get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?order=desc&limit=3")
    assert [m["index"] for m in newest["messages"]] == [3, 2, 1] and newest["next_before"] == 1
    assert "next_after" not in newest
    status, _, older = get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?order=desc&limit=3&before=1")
    assert [m["index"] for m in older["messages"]] == [0] and older["next_before"] is None
    status, _, between = get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?after=0&before=3")
    assert [m["index"] for m in between["messages"]] == [1, 2] and between["next_after"] is None
    assert get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?order=sideways")[0] == 400
    assert get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?before=-2")[0] == 400
    status, _, events = get_json(f"{shared_server.url}/v1/sessions/dur-history/events")
    kinds = [(e["turn_id"], e["type"]) for e in events["events"]]
    for t in turns:
        tid = t.data("turn.started")["turn_id"]
        assert [k for i, k in kinds if i == tid] == ["turn.started", "step.completed", "turn.completed"]
    status, _, backward = get_json(f"{shared_server.url}/v1/sessions/dur-history/events?order=desc")
    assert backward["events"] == events["events"][::-1] and backward["next_before"] is None
    status, _, last = get_json(f"{shared_server.url}/v1/sessions/dur-history/events?order=desc&limit=1")
    assert last["events"] == events["events"][-1:] and last["next_before"] == last["events"][0]["cursor"]
    done = next(e for e in events["events"] if e["type"] == "turn.completed")
    assert done["data"]["usage"]["completion_tokens"] == 5
    tid = turns[1].data("turn.started")["turn_id"]
    status, _, one = get_json(f"{shared_server.url}/v1/sessions/dur-history/events?turn={tid}")
    assert {e["turn_id"] for e in one["events"]} == {tid}
    status, _, empty = get_json(f"{shared_server.url}/v1/sessions/never-seen/messages")
    assert status == 404 and empty["error"]["code"] == "not_found"
    assert get_json(f"{shared_server.url}/v1/sessions/dur-history/messages?limit=0")[0] == 400


def test_checkpoint_put_then_latest(shared_server):
    base = shared_server.url
    assert get_json(f"{base}/v1/sessions/dur-ckpt/checkpoints/latest")[0] == 404
    status, _, saved = put(base, "dur-ckpt", "step-1", b"one")
    assert status == 200 and saved["durability"] == "local" and saved["key"] == "step-1"
    status, _, saved2 = put(base, "dur-ckpt", "step-2", b"\x00two\xff")
    assert saved2["seq"] > saved["seq"]
    import urllib.request
    with urllib.request.urlopen(f"{base}/v1/sessions/dur-ckpt/checkpoints/latest") as resp:
        assert resp.read() == b"\x00two\xff"
        assert resp.headers["X-Checkpoint-Key"] == "step-2"
        assert int(resp.headers["X-Checkpoint-Seq"]) == saved2["seq"]
    status, _, err = put(base, "dur-ckpt", "big", b"x" * (1 << 20 | 1))
    assert status == 413 and err["error"]["code"] == "checkpoint_too_large"
    # one just under the limit comes back whole
    body = bytes(range(256)) * 4000
    assert put(base, "dur-ckpt-big", "step-1", body)[0] == 200
    with urllib.request.urlopen(f"{base}/v1/sessions/dur-ckpt-big/checkpoints/latest") as resp:
        assert resp.read() == body
    assert put(base, "dur-ckpt", "bad%20key!", b"x")[0] == 400


def test_group_commit_fsyncs_far_fewer_times_than_records(make_server):
    """Ten SYNC writers, each its own process waiting for every ack: one fsync serves many.
    Counted by writer/log/0 itself (`agent-os status`), so the gateway's own log is not in it.
    The writers begin together, once all are connected (each one's start is an interpreter's)."""
    # A wide window: on a loaded machine (the suite runs on 6 workers) ten sender processes can take
    # hundreds of milliseconds to all send again (with 200 ms, one suite run saw 507 fsyncs for
    # 1,500 records, another 287); the writer waits at most this long for them.
    server = make_server({"storage": {"commit_window_us": 1000000}})

    def writer_stats():
        (row,) = [p for p in server.status()["processes"] if p["name"] == "writer/log/0"]
        return row["stats"]

    before = writer_stats()
    endpoint = f"ipc://{server.rundir}/broker.sock"
    go, logs = server.work_dir / "go", [server.work_dir / f"appender-{i}.log" for i in range(10)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(Path(__file__).parent)]))
    procs = [launch_python("sync_appender", [endpoint, f"appender/{i}", "150", str(go)], REPO, env, log)
             for i, log in enumerate(logs)]
    try:
        wait_until(lambda: all(b"ready" in log.read_bytes() for log in logs) or any(p.poll() is not None for p in procs),
                   60, "the appenders to connect")
        go.touch()
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            p.kill()
    outputs = [log.read_text() for log in logs]
    assert all("done 150" in o.splitlines() for o in outputs), outputs   # (a warning may be logged beside it)
    after = writer_stats()
    records_written = after["records"] - before["records"]
    fsyncs = after["fsyncs"] - before["fsyncs"]
    assert records_written >= 1500
    print(f"group commit: {records_written} records, {fsyncs} fsyncs")
    assert fsyncs < records_written / 3, (fsyncs, records_written)


def test_the_gateways_own_log_group_commits_concurrent_puts(make_server):
    """Ten HTTP clients PUTting at once into the gateway's log: one fsync serves many PUTs, and
    the records are in that log (wal/1), not writer/log/0's."""
    # A wider window than the default 2 ms, as above: under the suite's load a batch otherwise goes
    # before the clients' next PUTs are read (129 and 192 fsyncs for 600 PUTs in two runs). A wait
    # ends as soon as the batch holds as many PUTs as the last one, so a wide one costs a fast run nothing.
    server = make_server({"storage": {"commit_window_us": 100000}})
    before = scrape(server.url)

    async def client(session, i):
        for n in range(60):
            async with session.put(f"{server.url}/v1/sessions/gc-{i}/checkpoints/k{n}", data=os.urandom(2048)) as resp:
                assert resp.status == 200

    async def go():
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(client(session, i) for i in range(10)))

    asyncio.run(go())
    base = before.get("agentos_log_records_total", 0)
    after = wait_until(lambda: (v := scrape(server.url))["agentos_log_records_total"] - base >= 600 and v, 10,
                       "the log counters to be flushed")
    records_written = after["agentos_log_records_total"] - base
    fsyncs = after["agentos_log_fsyncs_total"] - before.get("agentos_log_fsyncs_total", 0)
    print(f"gateway log group commit: {records_written:.0f} records, {fsyncs:.0f} fsyncs")
    assert fsyncs < 600 / 2, (fsyncs, records_written)
    in_gateway_log = [kind for _, path in segments.list_segments(server.work_dir / "data" / "wal" / "1")
                      for _, kind, _, _, _ in records.scan(path.read_bytes())]
    assert in_gateway_log.count(RecordKind.BLOB) >= 600


def wal_records(data_dir: Path) -> list[tuple[int, bytes, bytes]]:
    out = []
    for writer_dir in sorted((data_dir / "wal").iterdir()):
        for _, path in segments.list_segments(writer_dir):
            out += [(kind, rid, body) for _, kind, rid, body, _ in records.scan(path.read_bytes())]
    return out


def test_acknowledged_records_survive_kill9_of_writers_and_tree_exactly_once(tmp_path):
    config = {"kernel": {"concurrency_limit": 64}, "storage": {"jsonl_dir": str(tmp_path / "jsonl")}}
    server = Server(tmp_path, config).start()
    acked_puts: list[tuple[str, str]] = []
    completed: list[tuple[str, str]] = []

    async def putter(session, stop, i):
        n = 0
        while not stop.is_set():
            key = f"k{n}"
            n += 1
            try:
                async with session.put(f"{server.url}/v1/sessions/kill-{i}/checkpoints/{key}", data=os.urandom(512),
                                       timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    if resp.status == 200:
                        acked_puts.append((f"kill-{i}", key))
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)

    async def turner(session, stop, i):
        while not stop.is_set():
            try:
                result = await run_turn(session, server.url, f"kturn-{i}", "go [[mock ttft_ms=20]]", timeout=60)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)
                continue
            if result.terminal == "turn.completed":
                completed.append((f"kturn-{i}", result.data("turn.started")["turn_id"]))

    async def load_goes_on():
        """1.5 s of load, longer on a slow machine: until some PUTs and turns more were acknowledged
        (each kill lands during load, and the four phases make the counts asserted below)."""
        puts, turns = len(acked_puts), len(completed)
        await asyncio.sleep(1.5)
        for _ in range(300):
            if len(acked_puts) >= puts + 15 and len(completed) >= turns + 3:
                return
            await asyncio.sleep(0.1)

    async def go():
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(putter(session, stop, i)) for i in range(6)]
            tasks += [asyncio.create_task(turner(session, stop, i)) for i in range(4)]
            loop = asyncio.get_running_loop()
            await load_goes_on()
            await loop.run_in_executor(None, server.kill9, "writer/log/0")
            await load_goes_on()
            await loop.run_in_executor(None, server.kill9, "gateway/0")   # and with it the log of the PUTs
            await load_goes_on()
            await loop.run_in_executor(None, server.kill9, "writer/store")
            await load_goes_on()
            await loop.run_in_executor(None, server.crash)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(go())
    finally:
        server.stop()
    assert len(acked_puts) > 50 and len(completed) > 10

    restarted = Server(tmp_path, config).start()
    try:
        # A sync read waits for the store to load everything the log holds.
        assert get_json(f"{restarted.url}/v1/sessions/{completed[0][0]}/messages")[0] == 200
    finally:
        assert restarted.stop() == 0

    log = wal_records(tmp_path / "data")
    ids = [rid for _, rid, _ in log]
    assert len(ids) == len(set(ids)), "a record was written twice"
    by_kind = collections.Counter(kind for kind, _, _ in log)
    db = tmp_path / "data" / "db"
    with duckdb.connect(str(db / "messages.db"), read_only=True) as con:
        blobs = collections.Counter(con.execute("SELECT session, key FROM checkpoints WHERE kind = 'blob'").fetchall())
        agent_ckpts = con.execute("SELECT count(*) FROM checkpoints WHERE kind = 'agent'").fetchone()[0]
        messages = collections.Counter(con.execute("SELECT turn FROM messages").fetchall())
    with duckdb.connect(str(db / "events.db"), read_only=True) as con:
        events = collections.Counter(con.execute("SELECT turn, type FROM events").fetchall())
        event_rows = con.execute("SELECT count(*) FROM events").fetchone()[0]
        event_keys = collections.Counter(con.execute("SELECT session, turn, seq, type FROM events").fetchall())
    jsonl = [orjson.loads(line) for line in (tmp_path / "jsonl" / "events.jsonl").read_bytes().splitlines()]
    with duckdb.connect(str(db / "access.db"), read_only=True) as con:
        access_rows = con.execute("SELECT count(*) FROM access").fetchone()[0]
    # DuckDB caught up with the log: one row per record, none missing, none twice.
    assert sum(blobs.values()) == by_kind[RecordKind.BLOB]
    assert agent_ckpts == by_kind[RecordKind.CHECKPOINT]
    assert event_rows == by_kind[RecordKind.EVENT]
    # The JSON-lines copy too: each event once, though writer/store and the tree died mid-load.
    assert collections.Counter((e["session"], e["turn"], e["seq"], e["type"]) for e in jsonl) == event_keys
    assert access_rows == sum(len(records.decode_body(body)["rows"]) for kind, _, body in log
                              if kind == RecordKind.ACCESS)
    # Every acknowledged checkpoint exactly once.
    assert all(blobs[key] == 1 for key in acked_puts), [k for k in acked_puts if blobs[k] != 1][:5]
    assert max(blobs.values()) == 1
    # Every completed turn: its two messages and its three events, exactly once.
    for _, turn_id in completed:
        assert messages[(turn_id,)] == 2, turn_id
        for kind in ("turn.started", "step.completed", "turn.completed"):
            assert events[(turn_id, kind)] == 1, (turn_id, kind)


def test_a_torn_tail_recovers_to_the_last_whole_record(tmp_path):
    server = Server(tmp_path).start()
    try:
        for n in range(5):
            assert put(server.url, "torn", f"k{n}", f"payload {n}".encode())[0] == 200
    finally:
        assert server.stop() == 0
    wal = tmp_path / "data" / "wal" / "1"    # the gateway's own log (storage.gateway_log) holds the PUTs
    last = segments.list_segments(wal)[-1][1]
    whole = [r for r in records.scan(last.read_bytes())]
    os.truncate(last, whole[-1][4] - 3)  # the last record torn three bytes short
    server = Server(tmp_path).start()
    try:
        assert "truncated a torn tail of" in server.log()
        assert put(server.url, "torn", "after", b"after the crash")[0] == 200
        import urllib.request
        with urllib.request.urlopen(f"{server.url}/v1/sessions/torn/checkpoints/latest") as resp:
            assert resp.read() == b"after the crash"
    finally:
        assert server.stop() == 0
    data = last.read_bytes()
    after = list(records.scan(data))
    assert not data[after[-1][4]:].strip(b"\0")           # every byte is a whole record, or zero
    assert [r[2] for r in after[:len(whole) - 1]] == [r[2] for r in whole[:-1]]
    assert after[len(whole) - 1][0] == whole[-1][0]         # the log went on where the torn record began
    assert whole[-1][2] not in {r[2] for r in after}       # and the torn record is gone


def test_a_restarted_gateway_reads_checkpoints_written_before_it_and_404s_the_rest(make_server):
    """Its cache starts empty: misses read the store as of where the logs ended at its start, and
    once the store's filter of sessions with checkpoints is here, a session neither it nor the
    gateway's own writes name is answered 404 without the store."""
    import urllib.error
    import urllib.request

    server = make_server({})

    def latest(sid):
        try:
            with urllib.request.urlopen(f"{server.url}/v1/sessions/{sid}/checkpoints/latest", timeout=10) as resp:
                return resp.status, resp.headers["X-Checkpoint-Key"], resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, None, None

    filters = "the store's filter of sessions with checkpoints"
    for n in range(5):
        assert put(server.url, "before-restart", f"k{n}", f"v{n}".encode())[0] == 200
    # the first gateway's filter first: the count of that line below then tells the second's
    wait_until(lambda: server.log().count(filters) >= 1, 20, "the first gateway to have the store's filter")
    server.kill9("gateway/0")

    def ready():
        try:
            return get_json(f"{server.url}/readyz")[0] == 200
        except OSError:
            return False      # not listening yet
    wait_until(ready, 20, "the restarted gateway to be ready")
    for _ in range(3):       # before and after it has heard from the store where the logs ended
        assert latest("before-restart") == (200, "k4", b"v4")
        assert latest("never-written")[0] == 404
        time.sleep(0.3)
    wait_until(lambda: server.log().count(filters) >= 2, 20, "the restarted gateway to have the store's filter")
    assert latest("before-restart") == (200, "k4", b"v4")
    assert latest("never-written")[0] == 404
    assert put(server.url, "before-restart", "k5", b"v5")[0] == 200
    assert latest("before-restart") == (200, "k5", b"v5")


def test_sessions_continue_with_their_history_after_ttl_eviction_and_actor_kill(make_server):
    server = make_server({"kernel": {"session_ttl_secs": 1}})
    sid = "dur-evict"
    first = turn(server.url, sid, "remember me")
    wait_until(lambda: scrape(server.url).get("agentos_sessions_evicted_total", 0) >= 1, 10, "TTL eviction")
    second = turn(server.url, sid, "after eviction")
    usage = [t.data("turn.completed")["usage"]["prompt_tokens"] for t in (first, second)]
    assert usage[1] > usage[0] + 5   # the model saw the first exchange again
    server.kill9(f"actor/{shard_of(sid, 2)}")
    third = turn(server.url, sid, "after the actor died")
    assert third.terminal == "turn.completed"
    assert third.data("turn.completed")["usage"]["prompt_tokens"] > usage[1]
    status, _, body = get_json(f"{server.url}/v1/sessions/{sid}/messages")
    assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
        "remember me", "after eviction", "after the actor died"]
