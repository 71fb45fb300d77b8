"""End-to-end: POST /v1/sessions/{sid}/fork makes a new session that begins with the first
messages of a session — all of them, or as many as asked, never parting a tool call from its
results — whose next turns go on from there while the original is untouched; only into a session
with no history, of the tenant's own sessions, and it outlives the original's close and its own
actor's kill -9."""
import json

from broker.sharding import actor_name
from harness import get_json, turn

ACME = {"Authorization": "Bearer key-acme", "Content-Type": "application/json"}
GLOBEX = {"Authorization": "Bearer key-globex", "Content-Type": "application/json"}
TOOLS = "[[mock tool_calls=get_weather,search ttft_ms=20]]"


def fork(base, sid, body=None, headers=ACME):
    return get_json(f"{base}/v1/sessions/{sid}/fork", method="POST", headers=headers,
                    body=None if body is None else json.dumps(body).encode())


def transcript(base, sid):
    status, _, body = get_json(f"{base}/v1/sessions/{sid}/messages?limit=1000", headers=ACME)
    assert status == 200, body
    return [(m["index"], m["role"], m["content"]) for m in body["messages"]]


def test_a_fork_begins_with_the_first_messages_and_goes_on_from_there(make_server, make_worker, tmp_path):
    server = make_server({"auth": {"api_keys": {"key-acme": "acme", "key-globex": "globex"}}})
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(tmp_path / "tools.txt")})
    base = server.url
    for text in (f"what is the weather in Paris {TOOLS}", "and tomorrow"):
        assert turn(base, "orig", text, headers=ACME).terminal == "turn.completed"
    original = transcript(base, "orig")
    assert [role for _, role, _ in original] == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant"]

    status, _, whole = fork(base, "orig")   # no body: all of it
    assert status == 201 and whole["forked_from"] == "orig" and whole["messages"] == 7, whole
    assert whole["session_id"].startswith("s")
    assert transcript(base, whole["session_id"]) == original

    status, _, branch = fork(base, "orig", {"session_id": "branch", "messages": 5})   # before the second question
    assert status == 201 and branch == {"session_id": "branch", "forked_from": "orig", "messages": 5}
    assert turn(base, "branch", "and next week", headers=ACME).terminal == "turn.completed"
    branched = transcript(base, "branch")
    assert branched[:5] == original[:5] and [(i, r) for i, r, _ in branched[5:]] == [(5, "user"), (6, "assistant")]
    assert branched[5][2] == "and next week"
    assert transcript(base, "orig") == original   # the original is untouched

    # Cuts that part a tool call from its results, or past the end; bad bodies.
    for count in (2, 3, 8):   # after the call, between its two results, past the end
        status, _, body = fork(base, "orig", {"session_id": f"cut-{count}", "messages": count})
        assert status == 409 and body["error"]["code"] == "invalid_cut", (count, body)
    for bad in ({"messages": 0}, {"messages": "2"}, {"messages": 1.5}, {"messages": True}, {"session_id": "a/b"},
                {"session_id": 7}, {"from": 1}):
        assert fork(base, "orig", bad)[0] == 400, bad
    # Only into a session with no history; only the tenant's own; none from nothing.
    status, _, body = fork(base, "orig", {"session_id": "branch"})
    assert status == 409 and body["error"]["code"] == "session_exists"
    assert fork(base, "orig", {"session_id": "orig"})[0] == 409
    assert fork(base, "nobody", {})[0] == 404
    assert fork(base, "orig", {}, GLOBEX)[0] == 404
    assert fork(base, "orig", {}, {})[0] == 401
    assert transcript(base, "branch") == branched   # nothing refused wrote anything

    listed = {s["session_id"] for s in get_json(f"{base}/v1/sessions", headers=ACME)[2]["sessions"]}
    assert {"orig", "branch", whole["session_id"]} <= listed and not any(s.startswith("cut-") for s in listed)

    # The original's close leaves the fork; the fork's actor's kill -9 loses none of it.
    assert get_json(f"{base}/v1/sessions/orig", method="DELETE", headers=ACME)[0] == 204
    assert get_json(f"{base}/v1/sessions/orig/messages", headers=ACME)[0] == 404
    server.kill9(actor_name("acme~branch", 2))
    assert turn(base, "branch", "and the week after", headers=ACME).terminal == "turn.completed"
    assert [(i, r) for i, r, _ in transcript(base, "branch")] == [(i, r) for i, r, _ in branched] + [
        (7, "user"), (8, "assistant")]
