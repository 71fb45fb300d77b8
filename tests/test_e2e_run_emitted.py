"""End-to-end: the values a flow run emits (ctx.emit), read a page at a time, long-polled, and
followed as server-sent events while the run goes on, resumed after the last one a reader had;
each value once, in order, though the run executed again after each of its waits."""
import asyncio

import aiohttp

from bench.sse_client import sse_events
from harness import get_json, scrape, wait_until
from test_e2e_flows import result, start


def test_a_runs_emitted_values_are_polled_followed_as_they_come_and_read_again(flows_server):
    base = flows_server.url
    _, _, run = start(base, "progress", {"count": 3})
    run_id = run["run_id"]
    first = get_json(f"{base}/v1/runs/{run_id}/emitted?wait=30")[2]   # (the run may not have emitted yet)
    assert [e["value"] for e in first["emitted"]] == [{"step": 0}] and first["status"] != "completed", first
    seq0 = first["emitted"][0]["seq"]

    async def follow() -> list:
        """After the first value: each next one comes as the run is told to go on."""
        events = []
        async with aiohttp.ClientSession() as http:
            async def go_on():
                async with http.post(f"{base}/v1/runs/{run_id}/channels/next", json={"message": 1}) as resp:
                    assert resp.status == 202
            async with http.get(f"{base}/v1/runs/{run_id}/emitted",
                                headers={"Accept": "text/event-stream", "Last-Event-ID": str(seq0)},
                                timeout=aiohttp.ClientTimeout(total=60)) as resp:
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                await go_on()
                async for event, body, ident in sse_events(resp):
                    events.append((event, body, ident))
                    if event == "emitted" and body["value"]["step"] < 2:
                        await go_on()
        return events

    events = asyncio.run(follow())
    assert [(e, b.get("value")) for e, b, _ in events] == [
        ("emitted", {"step": 1}), ("emitted", {"step": 2}), ("run.ended", None)], events
    assert events[-1][1] == {"status": "completed", "result": "done"}
    assert [i for _, _, i in events[:2]] == [b["seq"] for _, b, _ in events[:2]] and events[0][2] > seq0
    assert result(base, run_id)["result"] == "done"

    # read again once it has ended: each value once, in order, a page at a time
    page = get_json(f"{base}/v1/runs/{run_id}/emitted?limit=2")[2]
    assert [e["value"] for e in page["emitted"]] == [{"step": 0}, {"step": 1}] and page["status"] == "completed"
    rest = get_json(f"{base}/v1/runs/{run_id}/emitted?after={page['next_after']}")[2]
    assert [e["value"] for e in rest["emitted"]] == [{"step": 2}] and rest["next_after"] is None
    assert all(e["at"] > 0 for e in page["emitted"] + rest["emitted"])

    async def replayed() -> list:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/runs/{run_id}/emitted", headers={"Accept": "text/event-stream"},
                                timeout=aiohttp.ClientTimeout(total=30)) as resp:
                return [(event, body) async for event, body, _ in sse_events(resp)]
    assert [e for e, _ in asyncio.run(replayed())] == ["emitted"] * 3 + ["run.ended"]

    # counted by kind (this module's server ran this one run)
    def ops() -> dict:
        got = scrape(base)
        return {op: got.get(f'agentos_flow_ops_total{{op="{op}"}}') for op in ("emit", "wait")}
    wait_until(lambda: ops() == {"emit": 3, "wait": 2}, 10, f"the ops counted: {ops()}")

    assert get_json(f"{base}/v1/runs/no-such-run/emitted")[0] == 404
    assert get_json(f"{base}/v1/runs/no-such-run/emitted", headers={"Accept": "text/event-stream"})[0] == 404
    assert get_json(f"{base}/v1/runs/{run_id}/emitted", headers={"Last-Event-ID": "x"})[0] == 400
