"""End-to-end: writer/store reopens its DuckDB files (`storage.duckdb_recycle_secs`, one instance
for the four since storage/duck_files.py) while checkpoints, turns and reads keep coming."""
import os
import threading
import urllib.request

from harness import get_json, turn, wait_until

CONFIG = {"storage": {"duckdb_recycle_secs": 0.3}}


def _reopened(server) -> int:
    rows = server.status()["processes"]
    return next(r for r in rows if r["name"] == "writer/store")["stats"].get("reopened", 0)


def test_reopening_the_duckdb_files_under_traffic_loses_and_fails_nothing(make_server):
    server = make_server(CONFIG)
    newest: dict[str, bytes] = {}
    failures: list[tuple] = []
    stop = threading.Event()

    def put_checkpoints():
        n = 0
        while not stop.is_set():
            sid, body = f"ck-{n % 5}", os.urandom(3000)
            status, _, _ = get_json(f"{server.url}/v1/sessions/{sid}/checkpoints/k{n}", "PUT", body)
            if status == 200:
                newest[sid] = body
            else:
                failures.append(("PUT", sid, status))
            n += 1

    def read_from_the_store():   # each answered by a query on writer/store's DuckDB cursors
        while not stop.is_set():
            for path in ("/v1/sessions?limit=100", "/v1/sessions/t-0/events", "/v1/sessions/t-1/messages"):
                status, _, _ = get_json(server.url + path)
                if status != 200:
                    failures.append(("GET", path, status))

    for i in range(2):   # the sessions the reads name exist first
        assert turn(server.url, f"t-{i}", f"turn {i}").terminal == "turn.completed"
    threads = [threading.Thread(target=put_checkpoints), threading.Thread(target=read_from_the_store)]
    for thread in threads:
        thread.start()
    try:
        for i in range(2, 4):
            assert turn(server.url, f"t-{i % 2}", f"turn {i}").terminal == "turn.completed"
        start = _reopened(server)
        wait_until(lambda: _reopened(server) >= start + 4, 30, "four more reopens", interval=0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failures, failures[:5]
    assert server.stop() == 0
    log = server.log()
    assert "reopening the DuckDB files failed" not in log and " ERROR " not in log

    again = make_server(CONFIG)   # the same data: what the files hold after many reopens
    for sid, body in newest.items():
        with urllib.request.urlopen(f"{again.url}/v1/sessions/{sid}/checkpoints/latest", timeout=10) as resp:
            assert resp.read() == body, sid
    for sid in ("t-0", "t-1"):
        messages = get_json(f"{again.url}/v1/sessions/{sid}/messages")[2]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * 2
