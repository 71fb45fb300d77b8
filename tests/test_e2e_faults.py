"""End-to-end: the tree survives kill -9 of its parts, malformed frames, and drains on SIGTERM."""
import asyncio
import json
import os
import signal

import aiohttp
import pytest
import zmq

from broker.sharding import shard_of
from harness import Server, get_json, pid_alive, run_turn, start_turn, turn, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("faults")).start()
    yield server
    server.stop()
    assert not server.leftovers()


def test_kill9_of_an_actor_then_the_next_turn_of_its_session_succeeds(server):
    sid = "fault-actor"
    name = f"actor/{shard_of(sid, 2)}"
    assert turn(server.url, sid, "before").terminal == "turn.completed"
    restarts = server.restarts(name)
    server.kill9(name)
    after = turn(server.url, sid, "after the crash")
    assert after.status == 200 and after.terminal == "turn.completed"
    assert server.restarts(name) == restarts + 1


def test_children_are_adopted_by_the_supervisor_and_a_killed_fork_server_is_replaced(server):
    table = server.table()
    supervisor, forks = table["supervisor"]["pid"], table["forkserver"]["pid"]
    # Forked twice, each child is the supervisor's own: it waits for it and it dies with it.
    assert {_parent_of(row["pid"]) for row in table["children"]} == {supervisor}
    server.remember_pids()
    os.kill(forks, signal.SIGKILL)
    wait_until(lambda: server.table()["forkserver"]["pid"] not in (None, forks), 10, "a new fork server")
    assert server.table()["forkserver"]["restarts"] == 1
    rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
    assert rows["forkserver"]["pid"] == server.table()["forkserver"]["pid"] and rows["forkserver"]["restarts"] == 1
    server.remember_pids()
    server.kill9("actor/0")
    assert _parent_of(server.pid("actor/0")) == supervisor
    sid = next(f"fork-{i}" for i in range(100) if shard_of(f"fork-{i}", 2) == 0)
    assert turn(server.url, sid, "after a new fork server").terminal == "turn.completed"


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_kill9_of_the_broker_then_peers_reconnect_and_the_next_turn_succeeds(server):
    assert turn(server.url, "fault-broker", "before").terminal == "turn.completed"
    server.kill9("broker")
    after = turn(server.url, "fault-broker", "after the broker came back")
    assert after.status == 200 and after.terminal == "turn.completed"
    # Every role is back in the broker's peer table.
    wait_until(lambda: get_json(server.url + "/readyz")[0] == 200, 10, "readiness after the broker restart")


def test_malformed_frames_leave_the_broker_serving(server):
    ctx = zmq.Context()
    endpoint = f"ipc://{server.rundir}/broker.sock"
    socks = []
    try:
        anonymous = ctx.socket(zmq.DEALER)
        socks.append(anonymous)
        anonymous.connect(endpoint)
        named = ctx.socket(zmq.DEALER)
        socks.append(named)
        named.setsockopt(zmq.ROUTING_ID, b"fuzz/0#1")
        named.connect(endpoint)
        for payload in ([b"garbage"], [b"AOS/1", b"multi", b"part"], [b"AOS/7\x07actor/0xxxxxx"],
                        [b"AOS/1\x07actor/0\x01"], [b"AOS/1\x06broker\x0bctl.unknown\x00\x00"],
                        [os.urandom(5000)], [b"AOS/1\x07actor/0\x09ctl.stats\x02\x00\xc1\xc1\x80"]):
            for sock in socks:
                sock.send_multipart(payload)
        def malformed():
            rows = server.status()["processes"]
            broker = next(r for r in rows if r["role"] == "broker")
            return broker["stats"].get("malformed", 0) >= 10 and broker["stats"]["malformed"]
        wait_until(malformed, 15, "the broker to count the malformed frames", interval=0.2)
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
    assert server.proc.poll() is None and server.restarts("broker") <= 1  # only the kill -9 above
    assert turn(server.url, "fault-malformed", "still serving").terminal == "turn.completed"


def test_status_lists_every_role_with_a_pid(server):
    result = server.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    names = {r["name"]: r for r in data["processes"]}
    assert set(names) == {"supervisor", "forkserver", "broker", "mock-llm", "writer/log/0", "writer/store", "scheduler",
                          "actor/0", "actor/1", "gateway/0"}
    for row in names.values():
        assert row["pid"] and pid_alive(row["pid"])
        assert row["rss_kib"] > 0 and row["private_dirty_kib"] > 0
    assert data["memory_total"] == {key: sum(row[key] for row in names.values())
                                    for key in ("rss_kib", "private_dirty_kib", "private_kib", "pss_kib")}
    assert data["admission_limit"] == 0 and data["in_flight_turns"] == 0
    # the harness's poll: the same table and stats, without reading each process's memory
    polled = server.status()
    assert {r["name"] for r in polled["processes"]} == set(names) and "memory_total" not in polled
    assert all("rss_kib" not in r and r["stats"] for r in polled["processes"] if r["role"] == "actor")
    text = server.cli("status")
    assert "actor/1" in text.stdout and "Private_Dirty" in text.stdout


def test_sigterm_drains_in_flight_turns_and_exits_0(make_server):
    server = make_server({"kernel": {"drain_secs": 10}})

    async def go():
        async with aiohttp.ClientSession() as s:
            slow = await start_turn(s, server.url, "drain-slow", "slow [[mock ttft_ms=1500]]")
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            async with s.get(server.url + "/readyz") as resp:
                ready = resp.status
            rejected = await run_turn(s, server.url, "drain-new", "too late")
            return await slow, ready, rejected

    server.remember_pids()
    slow, ready, rejected = asyncio.run(go())
    assert slow.terminal == "turn.completed"
    assert ready == 503
    assert rejected.status == 503 and rejected.error["code"] == "draining"
    assert server.proc.wait(20) == 0
    wait_until(lambda: not server.leftovers(), 10, "every child to exit")


def test_kill9_of_the_supervisor_leaves_no_orphans(make_server):
    server = make_server()
    server.remember_pids()
    children = set(server.seen_pids)
    assert server.table()["forkserver"]["pid"] in children
    assert len(children) == 9   # eight children and the fork server they were forked from
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    # Children die with their parent (PR_SET_PDEATHSIG), they are not left to init.
    wait_until(lambda: not [p for p in children if pid_alive(p)], 15, "children of a killed supervisor to exit")


def test_idle_sessions_leave_memory_after_their_ttl(make_server):
    server = make_server({"kernel": {"session_ttl_secs": 5}})   # long enough to see them resident on a busy box
    from harness import scrape
    for i in range(3):
        assert turn(server.url, f"ttl-{i}", "hi").terminal == "turn.completed"
    wait_until(lambda: scrape(server.url)["agentos_active_sessions"] >= 1, 5, "the sessions to show as resident")
    wait_until(lambda: scrape(server.url).get("agentos_sessions_evicted_total", 0) == 3, 20, "TTL eviction")
    assert scrape(server.url)["agentos_active_sessions"] == 0
    assert turn(server.url, "ttl-0", "back again").terminal == "turn.completed"


def test_without_the_fork_server_children_start_on_their_own(make_server):
    server = make_server({"kernel": {"fork_server": False}})
    table = server.table()
    assert table["forkserver"]["pid"] is None
    assert {_parent_of(row["pid"]) for row in table["children"]} == {table["supervisor"]["pid"]}
    assert turn(server.url, "no-forks", "hello").terminal == "turn.completed"
    server.kill9("actor/1")   # restarted the same way
    sid = next(f"no-forks-{i}" for i in range(100) if shard_of(f"no-forks-{i}", 2) == 1)
    assert turn(server.url, sid, "hello").terminal == "turn.completed"
