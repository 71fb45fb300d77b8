"""`agent-os log check` and `agent-os log dump`: the write-ahead logs of a data directory, read offline."""
import io
import json

import orjson

from harness import get_json, turn
from log_frames import flip, torn
from storage import log_inspect, records, segments
from storage.records import RecordKind


def frame(kind: RecordKind, n: int, body: dict) -> bytes:
    return records.frame(kind, f"id-{n}".encode(), records.encode_body(body))


def two_segment_log(wal_root):
    """Log 0 with a sealed segment and a newest one: events of sessions a and b, then a BLOB."""
    log = segments.SegmentLog(wal_root / "0", segment_bytes=4096)
    try:
        for n in range(12):
            log.write(frame(RecordKind.EVENT, n, {"session": "ab"[n % 2], "tenant": "default", "turn": "t", "seq": n,
                                                  "type": "turn.delta", "data": {"text": "x" * 300}, "at": 1.0}),
                      sync=True)
        log.write(frame(RecordKind.BLOB, 99, {"session": "a", "tenant": "default", "key": "k", "seq": 1,
                                              "payload": b"\x00" * 700, "at": 2.0}), sync=True)
    finally:
        log.close()
    found = segments.list_segments(wal_root / "0")
    assert len(found) >= 2, "the log did not rotate"
    return found


def run(call, *args):
    out = io.StringIO()
    code = call(*args, out=out)
    return code, out.getvalue()


def test_check_counts_whole_records_and_tells_a_torn_tail_from_damage(tmp_path):
    wal = tmp_path / "wal"
    found = two_segment_log(wal)
    code, text = run(log_inspect.print_check, wal)
    assert code == 0, text
    assert "log 0: " in text and "13 records" in text and "BLOB 1" in text and "EVENT 12" in text
    assert text.rstrip().endswith("ok: every record whole")

    # Half a record after the newest segment's data: a batch cut short by a crash, which the
    # writer clears at its next start. Reported, not damage.
    newest_start, newest = found[-1]
    end = max(r[4] for r in records.scan(newest.read_bytes()))
    written = torn(frame(RecordKind.EVENT, 50, {"session": "a", "at": 3.0, "data": "x" * 700}), end)
    with open(newest, "r+b") as f:
        f.seek(end)
        f.write(written)
    code, text = run(log_inspect.print_check, wal)
    assert code == 0 and f"torn tail: {len(written):,} bytes at position {newest_start + end}" in text, text

    # One flipped byte inside a sealed segment's third record: damage, where it is.
    sealed_start, sealed = found[0]
    third = list(records.scan(sealed.read_bytes()))[2]
    data = bytearray(sealed.read_bytes())
    data[third[0] + 20] ^= 0xFF
    sealed.write_bytes(bytes(data))
    code, text = run(log_inspect.print_check, wal)
    assert code == 1, text
    assert f"segment {sealed_start}: damage: " in text and f"at position {sealed_start + third[0]}" in text
    assert "checksum mismatch" in text and "damaged:" in text
    # the records after it are still dumped
    code, text = run(log_inspect.print_dump, wal, "0", 0, [], None, 100)
    dumped = [json.loads(line)["id"] for line in text.splitlines()]
    assert len(dumped) == 12 and "id-2" not in dumped, dumped

    # In the newest segment, bytes that do not parse with whole records after them: damage too.
    fresh = tmp_path / "fresh"
    (newest_start, newest), = two_segment_log(fresh)[-1:]
    data = bytearray(newest.read_bytes())
    first = next(records.scan(bytes(data)))
    data[first[0] + 20] ^= 0xFF
    newest.write_bytes(bytes(data))
    code, text = run(log_inspect.print_check, fresh)
    assert code == 1 and f"segment {newest_start}: damage: " in text, text
    after = len(list(records.scan(bytes(data), first[4])))   # whole records after the damaged one
    # A writer's recovery clears them from the log and keeps them aside: check names the file.
    segments.SegmentLog(fresh / "0", segment_bytes=4096).close()
    code, text = run(log_inspect.print_check, fresh)
    kept = f"{newest.name}.damaged-{newest_start + first[0]}"
    assert code == 0 and f"kept aside: {kept}, " in text, text
    assert f"at position {newest_start + first[0]}, {after} whole record(s) in them" in text, text


def test_check_calls_a_last_record_with_every_sector_written_damage(tmp_path):
    """Nothing after it, but a torn write leaves a sector of its record zeros: this one was written
    whole, and a byte flipped since."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    log.write([frame(RecordKind.EVENT, n, {"session": "a", "data": "x" * 300}) for n in range(4)], sync=True)
    at = log.end - len(frame(RecordKind.EVENT, 3, {"session": "a", "data": "x" * 300}))
    log.close()
    (_, path), = segments.list_segments(tmp_path / "wal" / "0")
    flip(path, at + 20)
    code, text = run(log_inspect.print_check, tmp_path / "wal")
    assert code == 1 and "segment 0: damage: " in text and f"at position {at} " in text, text


def test_dump_writes_a_json_line_per_record_narrowed_by_session_kind_and_position(tmp_path):
    wal = tmp_path / "wal"
    two_segment_log(wal)
    code, text = run(log_inspect.print_dump, wal, None, 0, [], "a", 0)
    lines = [json.loads(line) for line in text.splitlines()]
    assert code == 0 and [r["kind"] for r in lines] == ["EVENT"] * 6 + ["BLOB"]
    assert [r["body"]["seq"] for r in lines[:6]] == [0, 2, 4, 6, 8, 10]
    assert lines[-1]["body"]["payload"] == {"bytes": 700} and lines[-1]["id"] == "id-99"
    assert [r["position"] for r in lines] == sorted(r["position"] for r in lines)
    _, text = run(log_inspect.print_dump, wal, "0", lines[3]["position"], [], None, 2)
    later = [json.loads(line) for line in text.splitlines()]
    assert len(later) == 2 and later[0]["position"] == lines[3]["position"] < later[1]["position"]
    _, text = run(log_inspect.print_dump, wal, None, 0, ["BLOB"], None, 0)
    assert [json.loads(line)["kind"] for line in text.splitlines()] == ["BLOB"]
    _, text = run(log_inspect.print_dump, wal, "1", 0, [], None, 0)
    assert text == ""    # no such log


def test_the_cli_checks_and_dumps_a_real_servers_logs(make_server):
    server = make_server()
    assert get_json(f"{server.url}/v1/sessions/inspected/checkpoints/k1", method="PUT", body=b"z" * 5000)[0] == 200
    assert turn(server.url, "inspected", "hello").terminal == "turn.completed"
    checked = server.cli("log", "check")   # beside the running server
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert server.stop() == 0
    checked = server.cli("log", "check")
    assert checked.returncode == 0 and "ok: every record whole" in checked.stdout, checked.stdout + checked.stderr
    dumped = server.cli("log", "dump", "--session", "inspected", "--kind", "BLOB")
    blobs = [orjson.loads(line) for line in dumped.stdout.splitlines()]
    assert [(b["body"]["key"], b["body"]["payload"]) for b in blobs] == [("k1", {"bytes": 5000})], dumped.stderr
    dumped = server.cli("log", "dump", "--session", "inspected", "--kind", "EVENT", "--kind", "FLOW")
    found = [orjson.loads(line) for line in dumped.stdout.splitlines()]
    events = [r["body"]["type"] for r in found if r["kind"] == "EVENT"]
    assert events[0] == "turn.started" and events[-1] == "turn.completed", events
    journal = [r["body"]["type"] for r in found if r["kind"] == "FLOW"]   # the turn's run
    assert journal[0] == "run.started" and journal[-1] == "run.ended", journal


def cli_into_a_pipe_nobody_reads(*args: str, unbuffered: bool):
    """`agent-os ARGS` with stdout on a pipe whose reader is gone, as `| head` leaves it."""
    import os
    import subprocess
    import sys
    from harness import REPO
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    reading, writing = os.pipe()
    os.close(reading)
    try:
        return subprocess.run([sys.executable, "-m", "agentos.cli", *args], cwd=REPO, stdout=writing,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**env, "PYTHONUNBUFFERED": "1"} if unbuffered else env)
    finally:
        os.close(writing)


def test_a_reader_that_leaves_early_gets_no_traceback_and_an_exit_code_that_says_what_happened(tmp_path):
    """Written through a buffer, the output meets the closed pipe once the command has ended: its
    own code stands. Written at once, it meets it mid-command: 141, as a shell shows a program
    that SIGPIPE ended."""
    two_segment_log(tmp_path / "wal")
    (tmp_path / "empty").mkdir()
    cases = {("dump", "logs"): 0, ("check", "logs"): 0, ("check", "empty"): 1}   # no logs: a failure
    for unbuffered in (False, True):
        for (action, where), code in cases.items():
            data_dir = tmp_path if where == "logs" else tmp_path / "empty"
            done = cli_into_a_pipe_nobody_reads("log", action, "--data-dir", str(data_dir), unbuffered=unbuffered)
            assert (done.returncode, done.stderr) == (141 if unbuffered else code, ""), (action, where, done.stderr)


def test_reader_gone_tells_a_closed_pipe_from_an_open_one():
    import os
    from agentos.cli import reader_gone
    reading, writing = os.pipe()
    try:
        assert not reader_gone(writing)
        os.close(reading)
        assert reader_gone(writing)
    finally:
        os.close(writing)
