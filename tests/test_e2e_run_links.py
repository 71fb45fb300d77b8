"""End-to-end: a parent run and its child on two actors, a word between them lost (its sender's
actor killed right after sending, its receiver's stopped and then killed with it unread): each
end still learns how the other stands (actors/run_links.py)."""
import json
import os
import signal
import time

from broker.sharding import actor_name
from harness import get_json, wait_until
from test_e2e_flows import result


def start_with_a_child_apart(server, flow: str, parent: str, kid_prefix: str) -> str:
    """Run `parent` of `flow`, whose child gets a run id served by the other actor; once the child
    is suspended, its run id."""
    kid = next(f"{kid_prefix}-{n}" for n in range(100) if actor_name(f"{kid_prefix}-{n}", 2) != actor_name(parent, 2))
    body = json.dumps({"input": {"child": kid}, "run_id": parent}).encode()
    assert get_json(f"{server.url}/v1/flows/{flow}/runs", method="POST", body=body)[0] == 201
    wait_until(lambda: get_json(f"{server.url}/v1/runs/{kid}")[2].get("status") == "suspended", 20, "the child to wait")
    return kid


def lose_a_word(server, receiver: str, sender: str, speak) -> None:
    """`speak()` has the actor of run `sender` send a word to that of run `receiver`, stopped
    meanwhile; then the sender's actor dies (its re-sends of the word with it) and the receiver's,
    with the word unread."""
    stopped = server.pid(actor_name(receiver, 2))
    os.kill(stopped, signal.SIGSTOP)
    try:
        assert speak()
        time.sleep(0.5)   # the word reaches the stopped actor's socket
        server.kill9(actor_name(sender, 2))
    except BaseException:
        os.kill(stopped, signal.SIGCONT)
        raise
    server.kill9(actor_name(receiver, 2))


def test_a_child_whose_actor_was_down_at_its_parents_cancel_is_cancelled_when_the_actor_is_back(make_server,
                                                                                                   make_worker):
    """The parent's actor re-sends its word of the cancel to the child's until it answers, but
    that actor died too: the word was lost with it, and the child once slept on for its hour."""
    server = make_server()
    make_worker(server)
    base = server.url
    parent = "orphans-parent"
    kid = start_with_a_child_apart(server, "parent_of_sleeper", parent, "orphan")
    lose_a_word(server, kid, parent,
                lambda: get_json(f"{base}/v1/runs/{parent}:cancel", method="POST")[2]["status"] == "cancelled")
    wait_until(lambda: get_json(f"{base}/v1/runs/{kid}")[2].get("status") == "cancelled", 20, "the child's cancel")
    assert parent in get_json(f"{base}/v1/runs/{kid}")[2]["error"]


def test_a_parent_whose_actor_died_with_its_childs_word_unread_still_gets_the_result(make_server, make_worker):
    """The child's actor tells the parent's that the child ended, re-sending until answered; but
    it died right after, and the parent's actor died with the word unread. The parent once stayed
    parked on its child for good; reloaded, it asks how the child stands (actors/run_links.py)."""
    server = make_server()
    make_worker(server)
    base = server.url
    parent = "waits-parent"
    kid = start_with_a_child_apart(server, "parent_of_waiter", parent, "waits-kid")

    def childs_end():
        for message in ("a", "b"):
            assert get_json(f"{base}/v1/runs/{kid}/channels/inbox", method="POST",
                            body=json.dumps({"message": message}).encode())[0] == 202
        wait_until(lambda: get_json(f"{base}/v1/runs/{kid}")[2].get("status") == "completed", 20, "the child's end")
        return True

    lose_a_word(server, parent, kid, childs_end)
    body = result(base, parent, timeout=30)
    assert (body["status"], body.get("result")) == ("completed", ["a", "b"])
