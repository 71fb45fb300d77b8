"""The gateway on a CPU of its own (agentos/cpu_layout.py): the plan, who is placed, and a real tree."""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from agentos import config as config_mod
from agentos import cpu_layout


def _allowed(pid: int) -> set[int]:
    line = next(row for row in Path(f"/proc/{pid}/status").read_text().splitlines()
                if row.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def test_the_gateway_takes_the_last_allowed_cpu_and_background_work_the_others():
    assert cpu_layout.plan({0}) is None                       # one CPU: nothing to spare
    assert cpu_layout.plan({0, 1}) == ({1}, {0})
    assert cpu_layout.plan({2, 5, 7, 0}) == ({7}, {0, 2, 5})   # the set the server was given, not 0..n
    assert cpu_layout.plan({2, 5, 7, 0}, 5) == ({5}, {0, 2, 7})   # the one its supervisor claimed
    assert cpu_layout.plan({0, 1}, 3) == ({1}, {0})              # a claim not allowed here: the last


def test_each_server_claims_the_last_cpu_no_other_servers_gateway_holds(tmp_path):
    claims = tmp_path / "claims"
    held = [cpu_layout.claim({0, 1, 2}, claims) for _ in range(3)]
    assert [cpu for cpu, _ in held] == [2, 1, 0]
    assert cpu_layout.claim({0, 1, 2}, claims) is None           # all held: the caller takes the last
    os.close(held[0][1])                                          # that server stopped (or was killed)
    again = cpu_layout.claim({0, 1, 2}, claims)
    assert again[0] == 2
    for _, fd in [again, *held[1:]]:
        os.close(fd)
    (tmp_path / "file").write_text("")
    assert cpu_layout.claim({0, 1}, tmp_path / "file") is None   # no claims can be made there


@pytest.fixture
def affinity(monkeypatch):
    """The process's CPUs as the layout sees them, without moving the test's own process."""
    calls: list[tuple[int, set[int]]] = []
    state = {"allowed": {0, 1, 2, 3}, "fail": False}

    def set_affinity(pid, cpus):
        if state["fail"]:
            raise OSError(22, "Invalid argument")
        calls.append((pid, set(cpus)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state["allowed"]))
    monkeypatch.setattr(os, "sched_setaffinity", set_affinity)
    monkeypatch.setattr(cpu_layout, "_background", None)
    return calls, state


def test_the_gateway_and_writer_store_are_placed_and_nothing_else(affinity):
    calls, _ = affinity
    log = logging.getLogger("test")
    config = config_mod.Config()
    for role in ("broker", "actor", "scheduler", "writer-log", "mock-llm"):
        cpu_layout.place(role, config, log)
    assert calls == [] and cpu_layout._background is None
    cpu_layout.place("gateway", config, log)
    assert calls == [(0, {3})]
    cpu_layout.background_thread()                            # a background thread of the gateway
    cpu_layout.background_process(4242)                       # a compaction helper it started
    assert calls[1:] == [(0, {0, 1, 2}), (4242, {0, 1, 2})]
    calls.clear()
    cpu_layout.place("writer-store", config, log)
    assert calls == [(0, {0, 1, 2})]
    calls.clear()
    for role in ("gateway", "writer-store"):                  # the CPU its supervisor claimed
        cpu_layout.place(role, config, log, gateway_cpu=1)
    assert calls == [(0, {1}), (0, {0, 2, 3})]


def test_switched_off_or_on_one_cpu_or_refused_nothing_is_pinned(affinity, caplog):
    calls, state = affinity
    log = logging.getLogger("test")
    off = config_mod.from_dict({"kernel": {"gateway_own_cpu": False}})
    cpu_layout.place("gateway", off, log)
    state["allowed"] = {3}
    cpu_layout.place("gateway", config_mod.Config(), log)
    assert calls == []
    state["allowed"], state["fail"] = {0, 1}, True
    cpu_layout.place("gateway", config_mod.Config(), log)     # a CPU taken away meanwhile
    assert cpu_layout._background is None and "could not pin gateway" in caplog.text
    cpu_layout.background_thread()                            # not placed: a no-op
    assert calls == []


def test_a_spares_zeroing_thread_leaves_the_gateways_cpu(tmp_path, monkeypatch):
    from storage import spares
    seen: list[str] = []
    monkeypatch.setattr(cpu_layout, "background_thread", lambda: seen.append(threading.current_thread().name))
    pool = spares.Spares(tmp_path, 4096, 1)
    assert pool.zero_next()
    pool.wait()
    assert seen == ["wal-spare"] and pool.ready() is not None
    pool.close()


def _gateway_cpu(server) -> int:
    import json
    return json.loads((server.run_root / "run" / "placement.json").read_text())["gateway_cpu"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing is pinned")
def test_a_real_tree_runs_its_gateway_on_a_cpu_of_its_own(shared_server):
    allowed = os.sched_getaffinity(0)
    gateway, background = cpu_layout.plan(allowed, _gateway_cpu(shared_server))
    assert _allowed(shared_server.pid("gateway/0")) == gateway
    assert _allowed(shared_server.pid("writer/store")) == background
    for name in ("broker", "scheduler", "writer/log/0"):       # the rest may run anywhere
        assert _allowed(shared_server.pid(name)) == allowed
    assert "of its own" in shared_server.log()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing is pinned")
def test_a_second_server_on_the_machine_puts_its_gateway_on_another_cpu(make_server, tmp_path):
    """Each supervisor claims its gateway's CPU (`kernel.gateway_cpu: -1`, the default; the test
    harness, like the benchmarks, pins the last one); a second server's gateway does not land on
    the first one's (nor its writer/store on the second's), and a restarted gateway keeps its CPU."""
    from harness import wait_until

    def claiming(name):
        return {"kernel": {"gateway_cpu": -1}, "storage": {"dir": str(tmp_path / name)}}
    first = _gateway_cpu(make_server(claiming("first")))
    second = make_server(claiming("second"))
    mine = _gateway_cpu(second)
    if first is None or mine is None:
        pytest.skip("every CPU's claim is held by servers outside this test")
    assert mine != first
    assert _allowed(second.pid("gateway/0")) == {mine}
    assert mine not in _allowed(second.pid("writer/store"))
    second.kill9("gateway/0")
    # placed at its start: it may not have got there yet when its pid is known
    wait_until(lambda: _allowed(second.pid("gateway/0")) == {mine}, 10, "the restarted gateway on its CPU")
