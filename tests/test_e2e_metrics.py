"""End-to-end: /metrics (summed over the tree) moves as turns run; the load generator counts
rejections and failures the way the server produced them."""
import asyncio

import aiohttp

from bench.loadgen import LoadConfig, run_load
from harness import scrape, start_turn, wait_until

DESIGN_NAMES = [
    "agentos_in_flight_turns", "agentos_admission_limit", "agentos_admission_rejected_total",
    "agentos_active_sessions", "agentos_active_processes", "agentos_event_db_write_wait_ms_count",
    "agentos_message_store_queue", "agentos_access_log_queue", "agentos_event_db_dropped_total",
    "agentos_turn_duration_ms_count", "agentos_tokens_prompt_total", "agentos_tokens_completion_total",
    "agentos_log_batch_records_count", "agentos_log_fsync_ms_count", "agentos_store_lag_records",
    "agentos_turn_ttft_ms_count",
]


def test_metrics_parse_and_move_as_turns_run(shared_server):
    url = shared_server.url
    before = scrape(url)

    async def go():
        async with aiohttp.ClientSession() as s:
            slow = await start_turn(s, url, "met-1", "slow [[mock ttft_ms=2500]]")
            during = await asyncio.get_running_loop().run_in_executor(
                None, lambda: wait_until(lambda: (v := scrape(url))["agentos_in_flight_turns"] >= 1 and v, 10,
                                         "in-flight turns to show"))
            return await slow, during

    result, during = asyncio.run(go())
    assert result.terminal == "turn.completed"
    assert during["agentos_in_flight_turns"] >= 1
    # Wait for this turn's own mark (2 s or longer): counts of earlier tests' turns on this shared
    # server may land in between, each process flushing its metrics once a second — and not all
    # at once, so the turn's count is waited for too.
    completed = 'agentos_turns_total{outcome="completed"}'
    after = wait_until(lambda: _slow_turns(v := scrape(url)) > _slow_turns(before) and v["agentos_in_flight_turns"] == 0
                       and v.get(completed, 0) > before.get(completed, 0) and v, 10, "the turn to be counted")
    for name in DESIGN_NAMES:
        assert name in after, name
    assert after["agentos_admission_limit"] == 0
    assert after[completed] > before.get(completed, 0)
    assert after["agentos_tokens_completion_total"] >= before.get("agentos_tokens_completion_total", 0) + 5
    # Millisecond buckets exist too (the 2.5 s turn landed in those of seconds: waited for above).
    assert after['agentos_turn_duration_ms_bucket{le="1.0"}'] >= 0
    assert after['agentos_bus_messages_total{kind="turn.start"}'] >= 1
    assert after['agentos_bus_messages_total{kind="permit.grant"}'] >= 1
    assert after["agentos_log_fsyncs_total"] >= 1


def _slow_turns(values: dict[str, float]) -> float:
    """Turns that took 2 s or more, from the duration histogram."""
    return (values.get('agentos_turn_duration_ms_bucket{le="+Inf"}', 0)
            - values.get('agentos_turn_duration_ms_bucket{le="2000.0"}', 0))


def test_provider_errors_and_restarts_are_counted(make_server):
    server = make_server()
    from harness import turn
    assert turn(server.url, "met-err", "x [[mock error=500]]").terminal == "turn.failed"
    server.kill9("scheduler")
    wait_until(lambda: scrape(server.url).get('agentos_provider_errors_total{kind="server_error"}', 0) >= 1, 10,
               "provider errors to be counted")
    wait_until(lambda: scrape(server.url).get('agentos_process_restarts_total{role="scheduler"}', 0) == 1, 10,
               "the restart to be counted")


def test_loadgen_counts_429s_and_failed_turns_like_the_server(make_server):
    server = make_server({"kernel": {"max_in_flight_turns": 2}})

    async def go():
        return await run_load(LoadConfig(url=server.url, concurrency=6, duration_secs=2.0, warmup_secs=0.0,
                                         input_text="fail [[mock error=500 ttft_ms=100]]", session_prefix="lg",
                                         pause_after_429_ms=20, turn_timeout_secs=20))

    report = asyncio.run(go())
    counts = report["counts"]
    assert counts["rejected_429"] > 0
    assert counts["failed"] > 0
    assert counts["ok"] == 0 and counts["broken"] == 0 and counts["http_error"] == 0 and counts["timeout"] == 0
    assert any("server_error" in str(sample) for sample in report["error_samples"]), report["error_samples"]
    # Every rejection and failure the load generator saw, the server counted too (it may count a
    # few more: attempts after the measured window).
    wait_until(lambda: (v := scrape(server.url))["agentos_admission_rejected_total"] >= counts["rejected_429"] and
               v.get('agentos_turns_total{outcome="failed"}', 0) >= counts["failed"], 10,
               "the server's counts to cover the load generator's")


def test_big_bodies_through_shared_memory_are_counted(shared_server):
    """A 150,000-character input crosses from gateway to actor as a big body: on this host's ipc
    bus through the gateway's ring, and /metrics says so."""
    from harness import turn
    key = 'agentos_bus_big_bodies_total{path="ring",role="gateway"}'
    before = scrape(shared_server.url).get(key, 0)
    assert turn(shared_server.url, "met-big", "x" * 150_000).terminal == "turn.completed"
    wait_until(lambda: scrape(shared_server.url).get(key, 0) > before, 10, "the big body to be counted")
