"""Tests for the checkpoint benchmark (bench/checkpoints.py and its report and targets).

The workload's arithmetic and the window maths run on synthetic numbers; the report is written
into a tmp results root; the agentos target runs end to end, through `main()`, against an
in-memory aiohttp fake of the checkpoint routes (on its own loop in a thread, port 0) that
rejects big bodies with 413, fails one fixed checkpoint with 500, and logs every request, so
counts, errors and the read-before-write order can be checked exactly. PostgreSQL and Redis
never appear here.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import zlib

import pytest
from aiohttp import web

from bench import checkpoints
from bench.checkpoint_report import (
    COLUMNS, ratios, summary_markdown, window_p99s, window_report,
)
from bench.checkpoint_targets import AgentOSTarget, process_tree_cpu_secs
from bench.checkpoint_workload import BenchConfig, Scale, make_payloads, parse_scale, payload_size

pytestmark = pytest.mark.timeout(30)


# ---------------------------------------------------------------------------------- workload
def test_payload_schedule_grows_2k_per_task_and_caps_at_64k():
    cfg = BenchConfig()
    assert [payload_size(j, cfg) for j in range(4)] == [2048, 4096, 6144, 8192]
    assert payload_size(30, cfg) == 63488
    assert payload_size(31, cfg) == 65536
    assert payload_size(32, cfg) == payload_size(99, cfg) == 65536


def test_payloads_are_made_once_pseudo_random_and_deterministic():
    cfg = BenchConfig()
    payloads = make_payloads(100, cfg)
    assert [len(p) for p in payloads] == [payload_size(j, cfg) for j in range(100)]
    assert all(isinstance(p, bytes) for p in payloads)
    assert payloads[5] == payloads[99][:len(payloads[5])]  # slices of one buffer
    assert make_payloads(3, cfg) == payloads[:3]
    assert len(zlib.compress(payloads[-1])) > 0.99 * len(payloads[-1])  # incompressible


def test_scales():
    assert parse_scale("1k") == Scale("1k", 100, 10)
    assert parse_scale("10k").checkpoints == 10_000
    assert (parse_scale("100k").agents, parse_scale("100k").tasks) == (1000, 100)
    assert parse_scale("5x3").checkpoints == 15
    for bad in ("2k", "5x", "x3", "0x3", "5x3x1", ""):
        with pytest.raises(ValueError):
            parse_scale(bad)


# ------------------------------------------------------------------------------ window maths
def test_window_p99_uses_full_windows_by_completion_time():
    ends, lats = [], []
    for k in range(3):  # 3 full 10 s windows of 100 commits each: latency k+1 ms
        for i in range(100):
            ends.append(k * 10 + i * 0.1)
            lats.append(float(k + 1))
    lats[100] = lats[101] = 500.0  # two spikes in window 1: its p99 (rank 99 of 100) is 500
    ends.append(31.0)  # the trailing partial window is left out
    lats.append(9999.0)
    windows = window_p99s(ends, lats, 10.0, duration_secs=35.0)
    assert [(w["start_secs"], w["n"], w["p99_ms"]) for w in windows] == [
        (0, 100, 1.0), (10, 100, 500.0), (20, 100, 3.0)]
    report = window_report(ends, lats, 35.0)
    assert report["used"] == "10s" and set(report["by_window"]) == {"10s"}
    used = report["by_window"]["10s"]
    assert (used["median_p99_ms"], used["worst_p99_ms"]) == (3.0, 500.0)
    assert used["series"][1] == [20.0, 500.0, 100]


def test_one_spike_in_a_hundred_is_below_p99_and_empty_windows_are_counted():
    ends = [0.5 + i * 0.001 for i in range(100)] + [2.5]
    lats = [1.0] * 99 + [80.0] + [7.0]  # second 1 has no commit at all
    report = window_report(ends, lats, 3.2)  # 0 full 10 s windows → 1 s windows too
    assert report["used"] == "1s"
    assert report["by_window"]["10s"]["full_windows"] == 0
    fine = report["by_window"]["1s"]
    assert (fine["full_windows"], fine["empty_windows"]) == (3, 1)
    assert fine["series"] == [[1.0, 1.0, 100], [2.0, None, 0], [3.0, 7.0, 1]]
    assert (fine["median_p99_ms"], fine["worst_p99_ms"]) == (1.0, 7.0)


def test_window_report_of_a_run_shorter_than_a_second_has_no_windows():
    report = window_report([0.1, 0.2], [1.0, 2.0], 0.4)
    fine = report["by_window"]["1s"]
    assert fine["median_p99_ms"] is None and fine["worst_p99_ms"] is None


# ------------------------------------------------------------------------------------ report
def fake_row(target: str, scale: str, mode: str, per_sec: float, p99: float, run: int = 1,
             prior: float = 1.0) -> dict:
    summary = {"p50": p99 / 3, "p95": p99 / 2, "p99": p99, "mean": p99 / 3, "max": p99, "n": 10}
    return {
        "target": target, "scale": scale, "mode": mode, "run": run, "checkpoints": 1000,
        "duration_secs": 1000 / per_sec, "checkpoints_per_sec": per_sec, "commit_ms": summary,
        "task_ms": summary, "read_ms": summary, "errors": {}, "errors_total": 0,
        "read_anomalies": 0, "reads": {}, "phase": "first-insert" if prior == 0 else "overwrite",
        "windows": window_report([i * 0.01 for i in range(3000)], [p99] * 3000, 31.0),
    }


def test_summary_and_results_folder(tmp_path):
    rows = [fake_row("agentos", "10k", "write", 3000.0, 5.0),
            fake_row("pgredis", "10k", "write", 1500.0, 10.0, prior=0),
            fake_row("pgredis", "10k", "write", 1000.0, 20.0, run=2)]
    assert ratios(rows) == [{"scale": "10k", "mode": "write", "throughput_ratio": 2.4,
                             "commit_p99_ratio": 0.333}]  # medians over pgredis's two runs
    floor = {"directory": "/tmp", "device": {"source": "/dev/vda", "mount": "/"}, "n": 10,
             "block_bytes": 4096, "p50_ms": 0.3, "p99_ms": 0.7, "mean_ms": 0.35, "max_ms": 1.0}
    config = {"bench": {"workers": 10, "repeat": 2}, "disk_floor": floor}
    text = summary_markdown(rows, config)
    assert "| " + " | ".join(COLUMNS) + " |" in text
    assert "| pgredis | 10k | write R2 | 1000 |" in text
    assert "## agentos vs pgredis" in text and "| 10k | write | 2.40 | 0.33 |" in text
    assert "## First insert vs overwrite" in text
    assert "p50 0.300 ms, p99 0.700 ms" in text

    path = checkpoints.write_results(rows, config, root=tmp_path)
    assert path.parent == tmp_path
    assert json.loads((path / "config.json").read_text())["disk_floor"] == floor
    lines = (path / "rows.jsonl").read_text().splitlines()
    assert [json.loads(line)["checkpoints_per_sec"] for line in lines] == [3000.0, 1500.0, 1000.0]
    assert (path / "summary.md").read_text() == text
    assert (path / "windowed_commit_p99.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ end to end against a fake
class FakeCheckpoints:
    """The checkpoint contract in memory. Bodies over `limit` get 413 before being read;
    (sid, key) in `fail` gets 500. `log` keeps (method, sid, key) of every request."""

    def __init__(self, limit: int, fail: set[tuple[str, str]]) -> None:
        self.limit, self.fail = limit, fail
        self.latest: dict[str, tuple[str, int, bytes]] = {}
        self.seq = 0
        self.log: list[tuple[str, str, str]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_put("/v1/sessions/{sid}/checkpoints/{key}", self.put)
        app.router.add_get("/v1/sessions/{sid}/checkpoints/latest", self.get_latest)
        return app

    @staticmethod
    def error(status: int, code: str) -> web.Response:
        return web.json_response({"error": {"code": code, "message": code}}, status=status)

    async def put(self, request: web.Request) -> web.Response:
        sid, key = request.match_info["sid"], request.match_info["key"]
        self.log.append(("PUT", sid, key))
        if request.content_type != "application/octet-stream":
            return self.error(415, "unsupported_media_type")
        if (request.content_length or 0) > self.limit:
            return self.error(413, "payload_too_large")
        body = await request.read()
        if (sid, key) in self.fail:
            return self.error(500, "internal")
        self.seq += 1
        self.latest[sid] = (key, self.seq, body)
        return web.json_response({"session_id": sid, "key": key, "seq": self.seq,
                                  "durability": "local"})

    async def get_latest(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        self.log.append(("GET", sid, ""))
        if sid not in self.latest:
            return self.error(404, "not_found")
        key, seq, body = self.latest[sid]
        return web.Response(body=body, content_type="application/octet-stream",
                            headers={"X-Checkpoint-Key": key, "X-Checkpoint-Seq": str(seq)})


@pytest.fixture()
def fake_server():
    """The fake on its own loop in a thread: main() runs its own loop in the test's thread."""
    api = FakeCheckpoints(limit=5000, fail={("bench-a3", "1")})
    ready, box = threading.Event(), {}
    loop = asyncio.new_event_loop()

    async def start() -> None:
        runner = web.AppRunner(api.app(), shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        box["runner"], box["port"] = runner, runner.addresses[0][1]

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "fake server did not start"
    yield api, f"http://127.0.0.1:{box['port']}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not thread.is_alive()


def test_agentos_end_to_end_counts_errors_and_reads_before_writing(fake_server, tmp_path,
                                                                   capsys, monkeypatch):
    api, url = fake_server
    run_benchmark = checkpoints.run_benchmark

    def slower(*args, **kwargs):   # a run that lasts into the next second, so the two times differ
        time.sleep(1.05)
        return run_benchmark(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "run_benchmark", slower)
    code = checkpoints.main([
        "--scales", "5x3", "--modes", "write,mixed", "--workers", "2", "--targets", "agentos",
        "--agentos-url", url, "--agentos-api-key", "secret", "--floor-iterations", "5", "--floor-each-run", "3",
        "--peer-tmp", str(tmp_path), "--results-root", str(tmp_path / "results"),
        "--op-timeout", "5"])
    assert code == checkpoints.EXIT_OK
    (folder,) = (tmp_path / "results").iterdir()
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert [(r["target"], r["mode"]) for r in rows] == [("agentos", "write"),
                                                        ("agentos", "mixed")]
    for r in rows:
        # task 2 (6 KB) of every agent is over the 5 KB limit; bench-a3's task 1 fails with 500
        assert r["attempted"] == 15 and r["checkpoints"] == 9 == r["commit_ms"]["n"]
        assert r["errors"] == {"commit_http_413": 5, "commit_http_500": 1}
        assert r["workers"] == 2 and r["duration_secs"] > 0
        assert {"client", "machine_busy"} <= set(r["cpu_percent_of_core"])
    write, mixed = rows
    assert write["phase"] == "first-insert" and mixed["phase"] == "overwrite"
    assert write["read_ms"]["n"] == 0
    assert mixed["read_ms"]["n"] == 9 and mixed["reads"] == {"hit": 15}
    assert mixed["read_anomalies"] == 0
    assert mixed["task_ms"]["p99"] >= mixed["commit_ms"]["p50"]

    for agent in range(5):  # write mode: commits only; mixed mode: a read before each commit
        sid = f"bench-a{agent}"
        ops = [(m, k) for m, s, k in api.log if s == sid]
        assert ops == [("PUT", "0"), ("PUT", "1"), ("PUT", "2"),
                       ("GET", ""), ("PUT", "0"), ("GET", ""), ("PUT", "1"),
                       ("GET", ""), ("PUT", "2")]
    warmups = {s for _, s, _ in api.log if s.startswith("bench-warmup-")}
    assert warmups == {"bench-warmup-w0", "bench-warmup-w1"}

    config = json.loads((folder / "config.json").read_text())
    assert config["targets"]["agentos"]["durability_acked"] == ["local"]
    # the folder is written at the end: its start is the run's, not the writing's
    assert config["started_at"] < config["finished_at"]
    assert config["disk_floor"]["n"] == 5
    assert config["disk_floor_after"]["n"] == 5 and config["disk_floor_after"]["block_bytes"] == 4096
    assert "secret" not in (folder / "config.json").read_text()
    summary = (folder / "summary.md").read_text()
    assert "Again after the runs, 4096 B: p50" in summary
    assert all(r["disk_floor_p50_ms"] > 0 for r in rows)          # each run's own floor, just before it
    assert "## Commit p50 against the disk floor of the same minute" in summary
    assert "commit_http_413" in summary
    assert (folder / "windowed_commit_p99.png").exists()
    out = capsys.readouterr().out
    assert "| agentos | 5x3 | mixed | 9 |" in out


def test_new_agents_make_every_run_a_first_insert(fake_server, tmp_path):
    api, url = fake_server
    code = checkpoints.main([
        "--scales", "2x2", "--modes", "write,mixed", "--workers", "2", "--targets", "agentos",
        "--agentos-url", url, "--agentos-api-key", "secret", "--floor-iterations", "0", "--new-agents",
        "--peer-tmp", str(tmp_path), "--results-root", str(tmp_path / "results"), "--op-timeout", "5"])
    assert code == checkpoints.EXIT_OK
    (folder,) = (tmp_path / "results").iterdir()
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    # (the fake server fails bench-a3's task 1)
    assert [(r["mode"], r["phase"], r["checkpoints"]) for r in rows] == [("write", "first-insert", 4),
                                                                         ("mixed", "first-insert", 3)]
    agents = {s for _, s, _ in api.log if s.startswith("bench-a")}
    assert agents == {"bench-a0", "bench-a1", "bench-a2", "bench-a3"}
    mixed_reads = [s for m, s, _ in api.log if m == "GET" and s.startswith("bench-a")]
    assert sorted(set(mixed_reads)) == ["bench-a2", "bench-a3"]     # the second run's own agents


def test_a_refused_connection_is_counted_not_raised(tmp_path):
    cfg = BenchConfig(scales=("2x2",), modes=("mixed",), workers=1, op_timeout_secs=2)
    target = AgentOSTarget("http://127.0.0.1:9", cfg.op_timeout_secs)
    rows, _ = checkpoints.run_benchmark(cfg, [lambda: contextlib.nullcontext(target)],
                                        progress=lambda s: None)
    (row,) = rows
    assert row["checkpoints"] == 0 and row["errors"] == {"read_broken": 4}
    assert row["checkpoints_per_sec"] == 0


def test_process_tree_cpu_counts_our_own_process():
    assert process_tree_cpu_secs([os.getpid()]) > 0
    assert process_tree_cpu_secs([]) == 0


def test_cli_rejects_unknown_targets():
    with pytest.raises(SystemExit):
        checkpoints.main(["--targets", "mysql"])


def test_the_layer_table_puts_each_layer_of_a_commit_side_by_side():
    rows = [fake_row("noop-http", "1k", "write", 6000.0, 0.6), fake_row("agentos-none", "1k", "write", 1300.0, 3.0),
            fake_row("agentos", "1k", "write", 500.0, 6.0), fake_row("pgredis", "1k", "write", 400.0, 9.0)]
    for row in rows:
        row["workers"] = 1
    floors = [{"directory": "/tmp", "device": {}, "n": 10, "block_bytes": size, "p50_ms": p50, "p99_ms": 1.0,
               "mean_ms": 0.4, "max_ms": 2.0} for size, p50 in ((4096, 0.3), (11264, 0.32))]
    text = summary_markdown(rows, {"bench": {"workers": 1}, "disk_floor": floors[0], "disk_floors": floors})
    assert ("| 1k | write | 1 | 0.20 (6,000/s) | 1.00 (1,300/s) | – | 2.00 (500/s) | 0.300 | 0.320 |" in text)
    assert "11264 B append + fdatasync" in text
    assert "Where a commit's time goes" not in summary_markdown(rows[2:], {"bench": {"workers": 1}})


def test_the_noop_server_answers_the_checkpoint_routes_like_ours(tmp_path):
    """`noop-http` through the agentos client: acks a PUT, serves the newest body, 404 before any."""
    cfg = BenchConfig(scales=("2x3",), modes=("mixed",), workers=2, op_timeout_secs=5)
    rows, described = checkpoints.run_benchmark(cfg, [lambda: checkpoints.noop_started(cfg)], progress=lambda s: None)
    (row,) = rows
    assert row["target"] == "noop-http" and row["checkpoints"] == 6 and row["errors_total"] == 0
    assert row["reads"] == {"miss": 2, "hit": 4} and row["read_anomalies"] == 0
    assert described["noop-http"]["durability_acked"] == ["none"]


def test_the_fsync_http_floor_acks_after_writing_and_leaves_no_scratch_file(tmp_path):
    """`fsync-http`: the same answers, acked `local`, its scratch log under the given dir while it
    runs (holding the bodies it acked) and gone afterwards."""
    cfg = BenchConfig(scales=("2x3",), modes=("write",), workers=2, op_timeout_secs=5)
    seen: list[int] = []

    def factory():
        @contextlib.contextmanager
        def started():
            with checkpoints.noop_started(cfg, durable_under=str(tmp_path)) as target:
                yield target
                (log,) = tmp_path.glob("bench-fsync-http-*/fsync-http.log")
                seen.append(log.read_bytes().count(payload_probe))
        return started()

    payload_probe = make_payloads(1, cfg)[0][:64]   # every body starts with these bytes
    rows, described = checkpoints.run_benchmark(cfg, [factory], progress=lambda s: None)
    (row,) = rows
    assert row["target"] == "fsync-http" and row["checkpoints"] == 6 and row["errors_total"] == 0
    assert described["fsync-http"]["durability_acked"] == ["local"]
    assert seen and seen[0] >= row["checkpoints"]   # every acked body reached the file
    assert list(tmp_path.iterdir()) == []


def test_agentos_set_pairs_become_a_nested_config_and_bad_ones_are_refused():
    from bench.checkpoints import _overrides

    assert _overrides(["storage.compaction_interval_secs=5", "storage.durability=none", "gateway.fast_checkpoints=false"]) \
        == {"storage": {"compaction_interval_secs": 5, "durability": "none"}, "gateway": {"fast_checkpoints": False}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _overrides(["storage.dir"])


def test_each_peer_gets_its_own_ratio_table():
    rows = [fake_row("agentos", "10k", "write", 3000.0, 5.0), fake_row("pgredis", "10k", "write", 1500.0, 10.0),
            fake_row("langgraph", "10k", "write", 1000.0, 25.0)]
    text = summary_markdown(rows, {"bench": {"workers": 10, "repeat": 1}})
    assert "## agentos vs pgredis" in text and "| 10k | write | 2.00 | 0.50 |" in text
    assert "## agentos vs langgraph" in text and "| 10k | write | 3.00 | 0.20 |" in text
