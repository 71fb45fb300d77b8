"""End-to-end: GET /v1/sessions/{sid} tells a session's message count and activity as the listing
does, and its running turn, by whose id a client that lost the stream follows it again; 404 for
a session with nothing (none, another tenant's, a closed one)."""
import asyncio

import aiohttp

from harness import get_json, start_turn, turn

ACME = {"Authorization": "Bearer key-acme"}
GLOBEX = {"Authorization": "Bearer key-globex"}
SLOW = "[[mock ttft_ms=2500]]"


def test_a_session_tells_its_messages_and_its_running_turn_to_follow_again(make_server):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    base = server.url

    async def main():
        async with aiohttp.ClientSession() as http:
            async def session(sid, headers=ACME):
                async with http.get(f"{base}/v1/sessions/{sid}", headers=headers) as resp:
                    return resp.status, await resp.json()

            running = await start_turn(http, base, "chat", f"a slow one {SLOW}", headers=ACME)
            status, body = await session("chat")
            assert status == 200 and body["active_turn"] is not None, body
            turn_id = body["active_turn"]["turn_id"]
            assert turn_id.startswith("t") and body["active_turn"]["resumed"] is False
            # a client that lost the stream follows it again by that id, to its end
            async with http.get(f"{base}/v1/sessions/chat/turns/{turn_id}/events?after=0", headers=ACME) as resp:
                assert resp.status == 200
                text = await resp.text()
            assert "event: turn.completed" in text
            assert (await running).terminal == "turn.completed"
            status, body = await session("chat")
            assert status == 200 and body["active_turn"] is None and body["messages"] == 2, body
            assert 0 < body["first_at"] <= body["last_at"]
            assert (await session("chat", GLOBEX))[0] == 404      # another tenant's
            assert (await session("nobody"))[0] == 404
            assert (await session("chat", {}))[0] == 401

    asyncio.run(main())
    assert turn(base, "chat", "and another", headers=ACME).terminal == "turn.completed"
    status, _, body = get_json(f"{base}/v1/sessions/chat", headers=ACME)
    listed = [s for s in get_json(f"{base}/v1/sessions", headers=ACME)[2]["sessions"] if s["session_id"] == "chat"]
    assert status == 200 and body["messages"] == 4 and listed == [
        {k: body[k] for k in ("session_id", "messages", "first_at", "last_at")}]   # as the listing has it
    assert get_json(f"{base}/v1/sessions/chat", method="DELETE", headers=ACME)[0] == 204
    assert get_json(f"{base}/v1/sessions/chat", headers=ACME)[0] == 404          # closed: nothing left
