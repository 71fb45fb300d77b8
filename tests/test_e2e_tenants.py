"""End-to-end: API keys map to tenants; a tenant sees nothing of another's (404, never 403);
one tenant's share of the admission gate cannot starve the others."""
import asyncio
import json

import aiohttp

from harness import get_json, run_turn, start_turn, status_of, turn, wait_until

ACME = {"Authorization": "Bearer key-acme"}
GLOBEX = {"Authorization": "Bearer key-globex"}


def test_keys_tenants_and_isolation(make_server, make_worker):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}},
                          "kernel": {"flow_queues": "per_user=1 per key"}})
    make_worker(server)
    base = server.url
    assert get_json(f"{base}/v1/sessions/s1/messages")[0] == 401
    status, _, body = get_json(f"{base}/v1/sessions/s1/messages", headers={"Authorization": "Bearer nope"})
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert turn(base, "s1", "hi").status == 401

    mine = turn(base, "s1", "acme's secret", headers=ACME)
    assert mine.terminal == "turn.completed" and mine.data("turn.started")["session_id"] == "s1"
    assert get_json(f"{base}/v1/sessions/s1/messages", headers=ACME)[2]["messages"][0]["content"] == "acme's secret"
    assert get_json(f"{base}/v1/sessions/s1/checkpoints/k", method="PUT", body=b"acme", headers=ACME)[0] == 200
    # globex sees none of it: every route answers 404, never 403
    assert get_json(f"{base}/v1/sessions/s1/messages", headers=GLOBEX)[0] == 404
    assert get_json(f"{base}/v1/sessions/s1/events", headers=GLOBEX)[0] == 404
    assert get_json(f"{base}/v1/sessions/s1/checkpoints/latest", headers=GLOBEX)[0] == 404
    assert get_json(f"{base}/v1/sessions/s1/turns/current", method="DELETE", headers=GLOBEX)[0] == 404
    turn_id = mine.data("turn.started")["turn_id"]
    assert get_json(f"{base}/v1/sessions/s1/turns/{turn_id}/events", headers=GLOBEX)[0] == 404
    # globex's own "s1" is another session
    theirs = turn(base, "s1", "globex here", headers=GLOBEX)
    assert theirs.terminal == "turn.completed"
    assert [m["content"] for m in get_json(f"{base}/v1/sessions/s1/messages", headers=GLOBEX)[2]["messages"]
            if m["role"] == "user"] == ["globex here"]
    assert [m["content"] for m in get_json(f"{base}/v1/sessions/s1/messages", headers=ACME)[2]["messages"]
            if m["role"] == "user"] == ["acme's secret"]
    # closing its "s1" closes globex's own: acme's stays whole
    assert get_json(f"{base}/v1/sessions/s1", method="DELETE", headers=GLOBEX)[0] == 204
    assert get_json(f"{base}/v1/sessions/s1/messages", headers=GLOBEX)[0] == 404
    assert [m["content"] for m in get_json(f"{base}/v1/sessions/s1/messages", headers=ACME)[2]["messages"]
            if m["role"] == "user"] == ["acme's secret"]
    assert status_of(f"{base}/v1/sessions/s1/checkpoints/latest", headers=ACME) == 200
    assert get_json(f"{base}/v1/sessions/s1", method="DELETE", headers={"Authorization": "Bearer nope"})[0] == 401

    status, _, run = get_json(f"{base}/v1/flows/waiter/runs", method="POST", headers=ACME,
                              body=json.dumps({"input": {}, "run_id": "order-1"}).encode())
    assert status == 201 and run["run_id"] == "order-1"
    for method, path, body in (("GET", "/v1/runs/order-1", None), ("POST", "/v1/runs/order-1:cancel", None),
                               ("GET", "/v1/runs/order-1/attributes", None),
                               ("POST", "/v1/runs/order-1/channels/inbox", b'{"message": 1}'),
                               ("POST", "/v1/runs/order-1/attributes/n:update", b'{"handler": "incr"}')):
        got = get_json(f"{base}{path}", method=method, body=body, headers=GLOBEX)
        assert got[0] == 404, (path, got)
    status, _, other = get_json(f"{base}/v1/flows/async_steps/runs", method="POST", headers=GLOBEX,
                                body=json.dumps({"input": 1, "run_id": "order-1"}).encode())
    assert status == 201 and other["run_id"] == "order-1"   # globex's own run of that name
    assert get_json(f"{base}/v1/runs/order-1", headers=ACME)[2]["flow"] == "waiter"
    # a publish to a channel of the tenant reaches that tenant's runs alone, named as it names them
    wait_until(lambda: get_json(f"{base}/v1/channels/inbox", headers=ACME)[2]["count"] == 1, 20, "acme's waiter")
    assert get_json(f"{base}/v1/channels/inbox", headers=ACME)[2]["runs"][0]["run_id"] == "order-1"
    assert get_json(f"{base}/v1/channels/inbox", headers=GLOBEX)[2]["count"] == 0
    for headers, delivered in ((GLOBEX, 0), (ACME, 1)):
        assert get_json(f"{base}/v1/channels/inbox", method="POST", headers=headers,
                        body=b'{"message": "to all"}')[2]["delivered"] == delivered

    # a flow sees its run's id as its client names it, and sends to it by that id
    status, _, me = get_json(f"{base}/v1/flows/whoami/runs", method="POST", headers=ACME,
                             body=json.dumps({"input": None, "run_id": "me-1"}).encode())
    assert status == 201, me
    assert get_json(f"{base}/v1/runs/me-1?wait=30", headers=ACME)[2].get("result") == ["me-1", "note"]

    # a child the flow names is its tenant's too: acme reaches it by that name, globex does not
    status, _, parent = get_json(f"{base}/v1/flows/parent_of_waiter/runs", method="POST", headers=ACME,
                                 body=json.dumps({"input": {"child": "kid-1"}}).encode())
    assert status == 201, parent
    wait_until(lambda: status_of(f"{base}/v1/runs/kid-1", headers=ACME) == 200, 20, "acme's child kid-1")
    assert status_of(f"{base}/v1/runs/kid-1", headers=GLOBEX) == 404
    wait_until(lambda: "waiting_on" in get_json(f"{base}/v1/runs/{parent['run_id']}", headers=ACME)[2], 20,
               "the parent to park on its child")
    waiting = get_json(f"{base}/v1/runs/{parent['run_id']}", headers=ACME)[2]["waiting_on"]
    assert waiting["op"] == "child" and waiting["children"] == ["kid-1"], waiting   # as acme names it
    for message in ("first", "second"):   # the child's two waits; its end completes the parent
        assert get_json(f"{base}/v1/runs/kid-1/channels/inbox", method="POST", headers=ACME,
                        body=json.dumps({"message": message}).encode())[0] == 202
    done = get_json(f"{base}/v1/runs/{parent['run_id']}?wait=30", headers=ACME)[2]
    assert done["status"] == "completed" and done["result"] == ["first", "second"], done
    status, _, theirs = get_json(f"{base}/v1/flows/async_steps/runs", method="POST", headers=GLOBEX,
                                 body=json.dumps({"input": 1, "run_id": "kid-1"}).encode())
    assert status == 201 and theirs["run_id"] == "kid-1"   # globex's own run of that name

    # a flow queue's key is its tenant's too: globex's "alice" does not wait behind acme's
    occupied = server.work_dir / "occupied.txt"
    for run_id, headers, secs in (("acme-alice", ACME, 60.0), ("globex-alice", GLOBEX, 0.05),
                                  ("acme-alice-2", ACME, 0.05)):
        status, _, run = get_json(f"{base}/v1/flows/queued/runs", method="POST", headers=headers, body=json.dumps(
            {"input": {"file": str(occupied), "secs": secs}, "run_id": run_id, "queue": "per_user",
             "queue_key": "alice"}).encode())
        assert status == 201, run
    done = get_json(f"{base}/v1/runs/globex-alice?wait=30", headers=GLOBEX)[2]
    assert done["status"] == "completed" and done["queue_key"] == "alice", done
    admitted = get_json(f"{base}/v1/runs/acme-alice", headers=ACME)[2]["admitted_at"]
    assert done["admitted_at"] - admitted < 2.5, (admitted, done)   # not after acme's run's 60 s
    # each tenant is told its own runs among the queue's: acme's second waits behind its first
    def per_user(headers):
        (queue,) = get_json(f"{base}/v1/queues", headers=headers)[2]["queues"]
        return queue["running"], queue["waiting"], queue["own"]
    wait_until(lambda: per_user(ACME) == (1, 1, {"running": 1, "waiting": 1}), 20, "acme's runs in per_user")
    assert per_user(GLOBEX) == (1, 1, {"running": 0, "waiting": 0})
    assert get_json(f"{base}/v1/runs/acme-alice:cancel", method="POST", headers=ACME)[0] == 200
    assert get_json(f"{base}/v1/runs/acme-alice-2?wait=30", headers=ACME)[2]["status"] == "completed"


def test_a_tenant_lists_its_own_sessions_a_page_at_a_time(make_server):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    base = server.url

    def listed(headers, query=""):
        status, _, body = get_json(f"{base}/v1/sessions{query}", headers=headers)
        assert status == 200, body
        return body

    for sid in ("b-chat", "a-chat"):
        assert turn(base, sid, f"hello {sid}", headers=ACME).terminal == "turn.completed"
    assert get_json(f"{base}/v1/sessions/c-ckpt/checkpoints/k", method="PUT", body=b"state", headers=ACME)[0] == 200
    assert turn(base, "a-chat", "globex's own", headers=GLOBEX).terminal == "turn.completed"
    assert turn(base, "z-globex", "only globex", headers=GLOBEX).terminal == "turn.completed"

    page = listed(ACME)
    assert [s["session_id"] for s in page["sessions"]] == ["a-chat", "b-chat", "c-ckpt"] and page["next_after"] is None
    transcript = get_json(f"{base}/v1/sessions/a-chat/messages", headers=ACME)[2]["messages"]
    first = page["sessions"][0]
    assert first["messages"] == len(transcript) >= 2 and first["first_at"] <= first["last_at"]
    assert page["sessions"][2]["messages"] == 0    # a checkpoint, no transcript
    assert [s["session_id"] for s in listed(GLOBEX)["sessions"]] == ["a-chat", "z-globex"]

    one = listed(ACME, "?limit=2")
    assert [s["session_id"] for s in one["sessions"]] == ["a-chat", "b-chat"] and one["next_after"] == "b-chat"
    two = listed(ACME, "?limit=2&after=b-chat")
    assert [s["session_id"] for s in two["sessions"]] == ["c-ckpt"] and two["next_after"] is None

    assert get_json(f"{base}/v1/sessions/b-chat", method="DELETE", headers=ACME)[0] == 204
    assert [s["session_id"] for s in listed(ACME)["sessions"]] == ["a-chat", "c-ckpt"]   # closed: gone at once
    assert get_json(f"{base}/v1/sessions?after=no%20spaces", headers=ACME)[0] == 400
    assert get_json(f"{base}/v1/sessions?limit=0", headers=ACME)[0] == 400
    assert get_json(f"{base}/v1/sessions")[0] == 401

    # the most recently active first, a page at a time; a session active again moves up
    assert turn(base, "d-chat", "hi", headers=ACME).terminal == "turn.completed"
    assert turn(base, "a-chat", "again", headers=ACME).terminal == "turn.completed"

    def recent(limit):
        ids, cursor = [], None
        for _ in range(10):
            page = listed(ACME, f"?order=recent&limit={limit}" + (f"&before={cursor}" if cursor else ""))
            ids += [s["session_id"] for s in page["sessions"]]
            cursor = page["next_before"]
            if cursor is None:
                return ids
        raise AssertionError("the listing did not end")
    assert recent(1) == recent(10) == ["a-chat", "d-chat", "c-ckpt"]
    assert [s["session_id"] for s in listed(GLOBEX, "?order=recent")["sessions"]] == ["z-globex", "a-chat"]
    for bad in ("order=newest", "order=recent&after=a-chat", "before=1.0/a-chat", "order=recent&before=a-chat",
                "order=recent&before=nan/a-chat", "order=recent&before=1.0/no%20spaces"):
        status, _, body = get_json(f"{base}/v1/sessions?{bad}", headers=ACME)
        assert status == 400 and body["error"]["code"] in ("invalid_parameter", "invalid_session_id"), (bad, body)


def test_a_tenants_share_of_the_gate_does_not_starve_others(make_server):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}},
                          "kernel": {"max_in_flight_turns": 10, "max_in_flight_turns_per_tenant": 1}})

    async def go():
        async with aiohttp.ClientSession() as s:
            slow = await start_turn(s, server.url, "a1", "slow [[mock ttft_ms=3000]]", headers=ACME)
            second = await run_turn(s, server.url, "a2", "over the share", headers=ACME)
            other = await run_turn(s, server.url, "g1", "globex is fine", headers=GLOBEX)
            return await slow, second, other

    slow, second, other = asyncio.run(go())
    assert slow.terminal == "turn.completed"
    assert second.status == 429 and "share" in second.error["message"]
    assert other.terminal == "turn.completed"

