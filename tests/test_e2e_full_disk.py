"""End-to-end: the log's disk fills up. SYNC writes fail fast with 507 and a log line, nothing
acknowledged is lost, records nobody waits for are written once space comes back, and the server
recovers by itself."""
import collections
import json
import os
import signal
import time
import urllib.request

import pytest

from harness import Server, get_json, scrape, turn, wait_until
from disk_filling import fill_with_checkpoints, put, put_new_sessions, read_back, tmpfs, wait_for_the_store
from test_e2e_flows import result, start
from storage import records, segments


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs where the write-ahead log lives (set up and torn down by the test)."""
    with tmpfs(tmp_path / "data" / "wal", "2m") as wal:
        yield wal


def fill(filler):
    """Fill the disk to the last byte (again: a failed write may give a page back)."""
    with open(filler, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def flow_records(wal):
    """Every flow journal record in the logs under `wal`, as the writers wrote them."""
    for writer in wal.iterdir():
        for _, path in segments.list_segments(writer) if writer.is_dir() else ():
            for _, kind, _, body, _ in records.scan(path.read_bytes()):
                if kind == records.RecordKind.FLOW:
                    yield records.decode_body(body)


def use_up_the_last_page(base):
    """Fill the actors' log's last page too (tmpfs allocates whole pages): start runs of a flow no
    worker serves, the smallest lone records there are, until three in a row are refused. Every
    record the test writes after that is bigger, so it is refused too."""
    refused = 0
    for n in range(200):
        status = get_json(f"{base}/v1/flows/nobody-serves-this/runs", method="POST",
                          body=json.dumps({"input": None, "run_id": f"s{n}"}).encode())[0]
        refused = refused + 1 if status == 507 else 0
        if refused == 3:
            return
    raise AssertionError("the actors' log kept taking records on a full disk")


def test_a_full_disk_fails_fast_with_507_and_recovers(small_disk, tmp_path):
    server = Server(tmp_path).start()
    filler = small_disk / "filler"
    try:
        for i in range(5):
            assert put(server.url, f"disk-{i}", "k", f"kept {i}".encode())[0] == 200
        fill(filler)
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
    journal = collections.Counter((r["run"], r["type"]) for r in flow_records(small_disk)
                                  if r["run"].startswith("disk-chat/"))
    runs = {run for run, _ in journal}
    assert len(runs) == 2, journal
    assert all(journal[run, kind] == 1 for run in runs for kind in ("run.started", "run.ended")), journal


def test_flow_requests_on_a_full_disk_answer_507_at_once_and_change_nothing(small_disk, make_server, make_worker):
    """Each once went unanswered (the client timed out) while the run kept in memory what its
    journal never got: an attribute read back, then lost at the next restart."""
    server = make_server()
    make_worker(server)
    base = server.url
    run_id = start(base, "with_attrs", {})[2]["run_id"]
    waiter = start(base, "waiter", {})[2]["run_id"]

    def attributes():
        return get_json(f"{base}/v1/runs/{run_id}/attributes")[2].get("attributes")

    def timed(call, *args, **kwargs):
        started = time.monotonic()
        status, _, answer = call(*args, **kwargs)
        assert time.monotonic() - started < 5, "answered at once, not after a timeout"
        return status, answer

    def update():
        return timed(get_json, f"{base}/v1/runs/{run_id}/attributes/count:update", method="POST",
                     body=b'{"handler": "incr", "arg": 1}')

    wait_until(lambda: attributes() == {"status": "started"}, 20, "the run to start")
    wait_until(lambda: get_json(f"{base}/v1/runs/{waiter}")[2]["status"] == "suspended", 20, "the waiter to wait")
    filler = small_disk / "filler"
    try:
        fill(filler)
        use_up_the_last_page(base)
        status, answer = timed(get_json, f"{base}/v1/flows/with_attrs/runs", method="POST",
                               body=b'{"input": {}, "run_id": "later"}')
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        assert get_json(f"{base}/v1/runs/later")[0] == 404
        status, answer = update()
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        assert attributes() == {"status": "started"}
        status, answer = timed(get_json, f"{base}/v1/runs/{run_id}/channels/finish", method="POST",
                               body=b'{"message": "now"}')
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        status, answer = timed(get_json, f"{base}/v1/runs/{waiter}/channels/inbox", method="POST",
                               body=b'{"message": "refused"}')
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        status, answer = timed(get_json, f"{base}/v1/runs/{run_id}:cancel", method="POST", body=b"{}")
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        assert get_json(f"{base}/v1/runs/{run_id}?wait=1")[2]["status"] == "suspended"   # still waits on "finish"

        filler.unlink()   # space comes back: the same requests succeed, on the run as its journal has it
        wait_until(lambda: update()[0] == 200, 20, "updates to succeed again", interval=0.3)
        assert get_json(f"{base}/v1/runs/{run_id}/channels/finish", method="POST", body=b'{"message": "now"}')[0] == 202
        assert result(base, run_id)["result"] == {"status": "done", "count": 1}
        for message in ("first", "second"):   # not the refused one: it never was
            assert get_json(f"{base}/v1/runs/{waiter}/channels/inbox", method="POST",
                            body=json.dumps({"message": message}).encode())[0] == 202
        assert result(base, waiter)["result"] == ["first", "second"]
    finally:
        if filler.exists():
            os.unlink(filler)


def test_a_step_result_refused_by_a_full_disk_runs_the_flow_on_from_its_journal(small_disk, tmp_path, make_server,
                                                                                 make_worker):
    """The worker once waited out its 300 s request timeout for an answer that never came, and the
    actor kept the refused result in memory, for the steps after it to be computed from."""
    server = make_server()
    make_worker(server)
    base = server.url
    marks = tmp_path / "marks"
    gate = tmp_path / "gate"   # step 1 returns once it exists: after the disk is full, however long that took
    # step 1 runs again once its result is refused: slow enough that the space is back by its end
    args = {"file": str(marks), "delays": [0.1, 2.0, 0.1, 0.1, 0.1], "gate": str(gate), "gate_step": 1}
    run_id = start(base, "five_steps", args)[2]["run_id"]
    starts = tmp_path / "marks.starts"
    wait_until(lambda: starts.exists() and "start 1" in starts.read_text(), 20, "step 1 to start")
    filler = small_disk / "filler"
    try:
        fill(filler)
        use_up_the_last_page(base)
        gate.touch()
        wait_until(lambda: marks.exists() and "step 1" in marks.read_text().split("\n"), 20, "step 1's effect")
        wait_until(lambda: f"run {run_id} had a journal record refused" in server.log(), 20, "step 1's result refused")
        filler.unlink()   # space comes back
        assert result(base, run_id, timeout=40)["result"] == 100
        # Step 1 ran again: its first result was refused, and its next execution did not take it
        # from the actor's memory.
        assert starts.read_text().count("start 1 ") == 2
    finally:
        if filler.exists():
            os.unlink(filler)
    # Each step's result is in the journal once, the refused one as its next execution reported it.
    server.stop()
    done = collections.Counter((r["seq"], r["result"]) for r in flow_records(small_disk)
                               if r["run"] == run_id and r["type"] == "step.done")
    assert done == {(n, n * 10): 1 for n in range(5)}, done


def test_a_write_to_a_run_on_its_way_back_from_a_full_disk_hears_507(small_disk, tmp_path, make_server, make_worker):
    """The run's reload waits for what it had appended, here an ASYNC step's result that the full
    disk keeps refusing. A publish to it once waited with the reload, past its own timeout."""
    server = make_server()
    make_worker(server)
    base = server.url
    marks = tmp_path / "marks"
    gate = tmp_path / "gate"   # the slow step returns once it exists: once the disk is full
    run_id = start(base, "async_then_sync", {"file": str(marks), "delay": 0.0, "gate": str(gate)})[2]["run_id"]
    wait_until(lambda: (tmp_path / "marks.starts").exists(), 20, "the slow step to start")
    filler = small_disk / "filler"
    try:
        fill(filler)
        use_up_the_last_page(base)
        gate.touch()
        wait_until(lambda: marks.exists() and "step 0" in marks.read_text(), 20, "the slow step's effect")
        # its result is refused, and so is the next step's start: the run goes back
        wait_until(lambda: f"run {run_id} had a journal record refused" in server.log(), 20, "the run to go back")
        began = time.monotonic()
        status, _, answer = get_json(f"{base}/v1/runs/{run_id}/channels/inbox", method="POST", body=b'{"message": 1}')
        assert status == 507 and answer["error"]["code"] == "insufficient_storage", answer
        assert time.monotonic() - began < 10, "answered after the reload's wait, not the request's timeout"
        assert get_json(f"{base}/v1/runs/{run_id}")[2]["status"] == "running"   # read from its journal
        filler.unlink()   # space comes back
        assert result(base, run_id, timeout=40)["result"] == 10
    finally:
        if filler.exists():
            os.unlink(filler)
    assert marks.read_text().split() == ["step", "0", "step", "1"]   # the slow step ran once


def reserves(server):
    return sum(v for k, v in scrape(server.url).items() if k.startswith("agentos_compaction_reserve_bytes"))


def test_a_disk_the_log_filled_with_superseded_checkpoints_frees_itself(tmp_path):
    """A session checkpointing fills the logs' volume (a volume of their own, as PostgreSQL's
    pg_wal often is) with checkpoints of its own that newer ones supersede. Compaction drops those
    by writing each segment anew without them, which needs room for the copy: without the log's
    compaction reserve (storage/compaction_reserve.py) every pass failed for want of it, and the
    disk stayed full, every write refused, until someone freed space by hand. The log's floor of
    free space (storage/free_space.py) is off: it would keep the disk from filling, and on a
    volume of its own the reserve is what frees it."""
    config = {"storage": {"segment_bytes": 256 << 10, "spare_segments": 1, "compaction_interval_secs": 1,
                          "min_free_bytes": 0}}
    size = 8 << 20
    with tmpfs(tmp_path / "data" / "wal", "8m") as wal:
        server = Server(tmp_path, config).start()
        try:
            wait_until(lambda: any(wal.glob("*/compaction.reserve")), 15, "the logs' compaction reserves")
            wait_until(lambda: reserves(server) == len(list(wal.glob("*/compaction.reserve"))) * (256 << 10), 10,
                       "the reserves' gauge")
            room = json.loads(server.cli("status", "--json").stdout)["disk"]
            assert 256 << 10 in room["compaction_reserves"].values(), room
            assert room["volumes"]["wal"]["total_bytes"] == size and "data" in room["volumes"], room
            free = scrape(server.url)
            assert free['agentos_disk_free_bytes{volume="wal"}'] < size < free['agentos_disk_free_bytes{volume="data"}']
            said = server.cli("status").stdout
            assert "compaction reserves: log " in said and "logs take appends to the last byte" in said
            kept = fill_with_checkpoints(server.url, cold_bytes=1000)
            room_left = os.statvfs(wal)   # what the gauge reads, but at once: a scrape of every metric
            # gave a pass's rewrite time to free three segments first (seen once in a full suite run)
            assert len(kept) > 100
            # full: to the last pages, or, if a pass took the reserve meanwhile, to the room kept for it
            assert room_left.f_bavail * room_left.f_frsize < (256 << 10) + (32 << 10)
            # far more than the reserves and a page's slack: a fifth of the disk, nothing freed by hand
            wait_until(lambda: scrape(server.url)['agentos_disk_free_bytes{volume="wal"}'] > size // 5, 30,
                       "compaction to free the disk", interval=0.5)
            assert put(server.url, "hot", "k", b"after" * 2400)[0] == 200
            assert [put(server.url, f"after-{n}", "k", b"a" * 12000)[0] for n in range(20)] == [200] * 20
            # Not asserted: that the reserve went to a pass. The fill stops at an append that did
            # not fit, up to 12 KB short of full, and a pass that came at once (0.3 s after, in
            # one full-suite run) found room there for a first rewrite that was nearly all
            # superseded checkpoints, and needed no reserve.
            read_back(server.url, kept)
        finally:
            assert server.stop() == 0


def test_a_disk_shared_by_the_logs_and_duckdb_frees_itself(tmp_path):
    """The default layout: the logs and DuckDB on one disk, filled by checkpoints (four of a hot
    session's, each superseding the last, to one of a new session) while writer/store is behind
    (stopped here). The store copies each checkpoint it keeps out of the log as it loads it, and
    compaction drops only what it has loaded: a log that wrote to the last byte left the store no
    room for those copies, and the disk stayed full for good (by hand, bench/RECORD.md,
    forty-sixth session; this test failed so with the floor off, the logs' compaction reserves
    too small for the copies). The log now stops `storage.min_free_bytes` before the disk is
    full, and as many bytes again before as the store has yet to load (with the margin alone the
    fill went down to it), and the store and compaction use that room to free what the superseded
    ones took."""
    size, margin = 128 << 20, 24 << 20
    config = {"storage": {"segment_bytes": 4 << 20, "spare_segments": 1, "compaction_interval_secs": 1,
                          "min_free_bytes": margin}}
    with tmpfs(tmp_path / "data", "128m"):
        server = Server(tmp_path, config).start()
        store = server.pid("writer/store")
        try:
            assert json.loads(server.cli("status", "--json").stdout)["disk"]["logs_min_free_bytes"] == margin
            assert "logs take appends down to 24.0 MiB free and what the store has yet to load" in server.cli("status").stdout
            assert scrape(server.url)["agentos_logs_min_free_bytes"] == margin
            os.kill(store, signal.SIGSTOP)
            try:
                kept = fill_with_checkpoints(server.url, hot_per_cold=4)
                # the logs kept room for what the stopped store had yet to load, not the margin
                # alone: about half of what was free when it stopped
                assert scrape(server.url)['agentos_disk_free_bytes{volume="data"}'] > margin + size // 5
            finally:
                os.kill(store, signal.SIGCONT)
            assert len(kept) > 500
            assert "would be left free on the log's disk (storage.min_free_bytes 25,165,824" in server.log()
            # the store catches up (the log keeps room for what it has yet to load, on top of the
            # margin) and compaction frees far more than the margin, nothing freed by hand
            free_when_full = scrape(server.url)['agentos_disk_free_bytes{volume="data"}']
            wait_for_the_store(server.url)
            wait_until(lambda: scrape(server.url)['agentos_disk_free_bytes{volume="data"}'] > free_when_full + size // 8, 30,
                       "compaction to free what the superseded checkpoints took", interval=0.5)
            put_new_sessions(server.url, 40)
            assert put(server.url, "hot", "k", b"after" * 2400)[0] == 200
            read_back(server.url, kept)
        finally:
            assert server.stop() == 0


def test_a_small_shared_disk_frees_itself_though_the_store_was_behind_by_most_of_it(tmp_path):
    """12 MiB holding the logs and DuckDB, filled as fast as PUTs go: writer/store is behind by
    most of the disk when it fills. With only the margin kept (a twentieth of the disk) it had no
    room for its copies of the checkpoints it keeps, and the disk stayed full for good (by hand,
    forty-sixth session: 0 of 40 PUTs taken). The logs now keep room for what the store has yet
    to load on top of the margin."""
    config = {"storage": {"segment_bytes": 256 << 10, "spare_segments": 1, "compaction_interval_secs": 1}}
    with tmpfs(tmp_path / "data", "12m"):
        server = Server(tmp_path, config).start()
        try:
            kept = fill_with_checkpoints(server.url)
            assert len(kept) > 50
            wait_until(lambda: put(server.url, "hot", "k", b"after" * 2400)[0] == 200, 30,
                       "writer/store to catch up and the log to take appends again", interval=0.5)
            put_new_sessions(server.url, 20)
            read_back(server.url, kept)
        finally:
            assert server.stop() == 0
