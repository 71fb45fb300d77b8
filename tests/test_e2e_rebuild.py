"""End-to-end: DuckDB is a projection — deleted, it is rebuilt from the log, however many segments
the log has (a store that read one segment per batch interval took minutes for a few hundred)."""
import asyncio
import shutil
import urllib.request

import aiohttp

from harness import Server, get_json
from storage import segments


def test_deleted_duckdb_files_are_rebuilt_from_a_log_of_many_segments(tmp_path):
    config = {"storage": {"segment_bytes": 64 << 10}}
    sessions = [f"rb-{i}" for i in range(8)]
    # 60 each: at least 60 segments however the PUTs batch (a batch of all eight sessions' 96 KB
    # overfills a 64 KB segment alone; 40 each gave 43 segments on a busy machine)
    puts = 60
    server = Server(tmp_path, config).start()
    try:
        async def client(http, sid):
            for n in range(puts):
                body = f"{sid}/{n};".encode() * 1500          # about 12 KB: a segment holds five
                async with http.put(f"{server.url}/v1/sessions/{sid}/checkpoints/k{n}", data=body) as resp:
                    assert resp.status == 200

        async def go():
            async with aiohttp.ClientSession() as http:
                await asyncio.gather(*(client(http, sid) for sid in sessions))
        asyncio.run(go())
        # a checkpoint's own session's transcript read syncs: the store has loaded it all
        assert get_json(f"{server.url}/v1/sessions/{sessions[0]}/messages")[0] == 404
    finally:
        assert server.stop() == 0
    gateway_log = tmp_path / "data" / "wal" / "1"
    assert len(segments.list_segments(gateway_log)) >= 50
    shutil.rmtree(tmp_path / "data" / "db")

    restarted = Server(tmp_path, config).start()
    try:
        # A sync read waits for the store to load everything the log holds (35 s at most).
        status, _, body = get_json(f"{restarted.url}/v1/sessions/{sessions[0]}/messages")
        assert (status, body["error"]["code"]) == (404, "not_found"), body
        for sid in sessions:          # every session's newest checkpoint, from the rebuilt projection
            with urllib.request.urlopen(f"{restarted.url}/v1/sessions/{sid}/checkpoints/latest", timeout=10) as resp:
                assert (resp.headers["X-Checkpoint-Key"], resp.read()) == (f"k{puts - 1}", f"{sid}/{puts - 1};".encode() * 1500)
    finally:
        assert restarted.stop() == 0
