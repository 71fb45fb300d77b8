"""The access log: a row for every HTTP request, gathered many to a log record."""
import asyncio
import http.client
import urllib.parse

from gateway import access
from harness import get_json
from storage import records, segments
from storage.records import RecordKind


class FakeLog:
    def __init__(self):
        self.appended = []

    def append_nowait(self, kind, body, session):
        self.appended.append((kind, body))


def test_rows_go_to_the_log_many_to_a_record():
    async def go():
        log = FakeLog()
        gathered = access.AccessLog(log)
        for status in (200, 404, 200):
            gathered.record("PUT", "/r", status, "t", "s", 0.0)
        assert log.appended == []                       # lingering for more
        await asyncio.sleep(access.LINGER_SECS * 3)
        [(kind, body)] = log.appended
        assert kind == RecordKind.ACCESS and [row[3] for row in body["rows"]] == [200, 404, 200]
        for _ in range(access.ROWS_PER_RECORD + 1):     # a full record goes at once
            gathered.record("GET", "/r", 200, "t", "s", 0.0)
        assert [len(b["rows"]) for _, b in log.appended] == [3, access.ROWS_PER_RECORD]
        gathered.flush()                                # as at shutdown: the rest, without waiting
        assert [len(b["rows"]) for _, b in log.appended] == [3, access.ROWS_PER_RECORD, 1]
        await asyncio.sleep(access.LINGER_SECS * 3)
        assert len(log.appended) == 3
        access.AccessLog(None).record("GET", "/r", 200, "t", "s", 0.0)   # no log: counted only
    asyncio.run(go())


def test_every_request_of_both_http_paths_has_its_row_in_the_log(make_server, tmp_path):
    server = make_server()
    host = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)   # keep-alive: the fast path
    answered = []
    for method, path, body in (("PUT", "/v1/sessions/acc/checkpoints/k1", b"one"),
                               ("PUT", "/v1/sessions/acc/checkpoints/k2", b"two"),
                               ("GET", "/v1/sessions/acc/checkpoints/latest", None),
                               ("GET", "/v1/sessions/nobody/checkpoints/latest", None)):
        conn.request(method, path, body=body)
        response = conn.getresponse()
        response.read()
        answered.append((method, response.status))
    conn.close()
    status, _, _ = get_json(f"{server.url}/v1/sessions/acc/messages")      # aiohttp's path (no transcript: 404)
    answered.append(("GET", status))
    assert answered == [("PUT", 200), ("PUT", 200), ("GET", 200), ("GET", 404), ("GET", 404)]
    assert server.stop() == 0    # a clean stop appends the rows still gathering

    rows = []
    for writer_dir in sorted((tmp_path / "data" / "wal").iterdir()):
        for _, path in segments.list_segments(writer_dir):
            rows += [row for _, kind, _, body, _ in records.scan(path.read_bytes()) if kind == RecordKind.ACCESS
                     for row in records.decode_body(body)["rows"]]
    rows = sorted((row for row in rows if row[5]), key=lambda row: row[0])   # not the harness's /readyz
    assert [(method, status) for _, method, _, status, _, _, _ in rows] == answered
    assert [session for *_, session, _ in rows] == ["acc"] * 3 + ["nobody", "acc"]
    assert all(duration >= 0 for *_, duration in rows)
