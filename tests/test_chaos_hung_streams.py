"""The chaos benchmark names each stream it counts as hung (its session, turn, when it was posted
on the kills' clock, how far it got), in its row and its summary: a count alone left a hung
stream in a starved run impossible to tell apart from one the server forgot."""
import asyncio
import json
import types

import aiohttp
from aiohttp import web

from bench.chaos_clients import Ledger, turn_client
from bench.chaos_report import accounting, write_report
from bench.results import ResultsDir


def test_a_stream_past_its_deadline_is_named_in_the_row_and_the_summary(tmp_path):
    async def turn_that_never_ends(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'id: 1\nevent: turn.started\ndata: {"turn_id": "t-slow"}\n\n')
        await asyncio.sleep(30)
        return resp

    async def go():
        app = web.Application()
        app.router.add_post("/v1/sessions/{sid}/turns", turn_that_never_ends)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        ledger, stop = Ledger(), asyncio.Event()
        try:
            async with aiohttp.ClientSession() as http:
                client = asyncio.ensure_future(turn_client(http, f"http://127.0.0.1:{port}", 3, ledger, stop,
                                                           deadline=0.4, pause=0.0))
                await asyncio.sleep(0.2)
                stop.set()
                await asyncio.wait_for(client, 5)
        finally:
            await runner.cleanup()
        return ledger

    ledger = asyncio.run(go())
    assert ledger.turns["hung"] == 1
    (hung,) = ledger.hung
    assert (hung["session"], hung["turn_id"], hung["last_event_id"], hung["status"]) == ("chaos-t3", "t-slow", 1, 200)
    assert 0 <= hung["posted_at"] < 0.2

    args = types.SimpleNamespace(duration=1.0, deadline=0.4)
    checked = {"lost": {"turns": [], "flows": [], "closes": []}, "flow_results": {}}
    row = accounting(args, ledger, [], checked, [], {}, {"before": {}}, {})
    assert row["hung"] == 1 and row["hung_streams"] == [hung] and row["deadline_secs"] == 0.4
    json.dumps(row)   # (the row is a JSON line)
    row.update(jsonl=None, bucket_outages=[], stalls=[], logged_errors={}, logged_error_lines=[])
    results = ResultsDir("chaos-hung", root=tmp_path)
    write_report(results, row, [], ledger, {"chaos_from": 0.0, "chaos_to": 1.0})
    summary = (results.path / "summary.md").read_text()
    assert ("Hung streams (posted at: seconds on the kills' clock; a stream's deadline 0.4 s): chaos-t3 turn "
            f"t-slow posted at {hung['posted_at']} s, last event id 1, picked up again 0 times") in summary
