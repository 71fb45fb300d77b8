"""Flow queues: the spec of `kernel.flow_queues`, the scheduler's places (FIFO within a tenant,
round-robin between tenants, nothing granted by a new scheduler before its holders said what
they hold, a restarted holder's runs not counted twice), a queue's rate (no more admitted in a
window than it allows, also by a new scheduler told the window's admissions), and an actor's
side: a queued run is `enqueued` until its grant, journals its admission before its first
dispatch, gives its place back once its end is in the log, reports its admission for the rate's
window, and a replayed admitted run is not queued again."""
import asyncio
import time

import pytest

from actors.flow_queues import ADOPT_SECS, SWEEP_SECS, QueuePools, QueueSpec, QueueSpecError, parse_queues, place_of
from actors.flow_state import replay
from agentos.config import Config, ConfigError
from agentos.config_checks import validate
from broker.protocol import Kind, Message
from test_delayed_starts import sent, start
from test_flow_results_due import running_flows


def test_the_spec_names_each_queue_once_with_a_whole_limit_and_perhaps_a_rate():
    assert parse_queues("reports=2, mail = 10 @ 50/30s, hooks=*@5/0.5, users=1 per key, api=*@2/1s  per  key, "
                        "fair=3 per tenant") == {
        "reports": QueueSpec(2), "mail": QueueSpec(10, 50, 30.0), "hooks": QueueSpec(None, 5, 0.5),
        "users": QueueSpec(1, per="key"), "api": QueueSpec(None, 2, 1.0, per="key"), "fair": QueueSpec(3, per="tenant")}
    assert parse_queues("") == {}
    for bad in ("reports", "reports=0", "reports=1.5", "a b=1", "x=1,x=2", "q=-1", "q=100001", "q=*", "q=1@0/1s",
                "q=1@5/0s", "q=1@5", "q=1@5/1m", "q=*@", "q=1@5/86401", "q=1@100001/1s", "q=@5/1s", "q=1 per",
                "q=per key", "q=1 per keys", "q=1 per user"):
        with pytest.raises(QueueSpecError):
            parse_queues(bad)
    config = Config()
    config.kernel.flow_queues = "reports=two"
    with pytest.raises(ConfigError, match="kernel.flow_queues"):
        validate(config)


def test_a_queue_grants_its_limit_in_order_and_a_release_lets_the_next_in():
    t0 = 100.0
    pools = QueuePools(parse_queues("q=2, other=1"), t0)
    got = []
    for i, tenant in enumerate(["a", "a", "a", "b"]):
        got += pools.request("q", f"r{i}", "actor/0", tenant, t0 + 0.1)
    assert got == []
    # a queue taken out of the config since its runs were started: they run, with no limit left
    assert pools.request("gone", "x", "actor/0", "a", t0) == [("actor/0", "gone", "x")]
    assert pools.sync("actor/1", 1, {"gone": {"held": [], "waiting": [["y", "a"]]}}, t0) == [("actor/1", "gone", "y")]
    got = pools.tick(t0 + ADOPT_SECS + 0.1)   # a new scheduler waited for its holders' reports
    assert got == [("actor/0", "q", "r0"), ("actor/0", "q", "r3")]   # tenant a's first, then b's
    assert pools.request("q", "r0", "actor/0", "a", t0 + 4) == [("actor/0", "q", "r0")]   # a re-sent request
    assert pools.release("q", "r3", t0 + 5) == [("actor/0", "q", "r1")]
    assert pools.stats(t0 + 5)["q"] == {"limit": 2, "running": 2, "waiting": 1}
    assert pools.stats(t0 + 5)["other"] == {"limit": 1, "running": 0, "waiting": 0}


def test_a_new_scheduler_adopts_what_holders_hold_before_it_grants_and_a_restarted_holder_is_not_counted_twice():
    t0 = 100.0
    pools = QueuePools(parse_queues("q=2"), t0)
    # after a restart of the scheduler: actor/0 holds two runs and waits with a third
    assert pools.sync("actor/0", 1, {"q": {"held": ["a", "b"], "waiting": [["c", "t"]]}}, t0 + 1) == []
    assert pools.tick(t0 + ADOPT_SECS + 1) == []          # both places are taken
    assert pools.stats(t0 + ADOPT_SECS + 1)["q"] == {"limit": 2, "running": 2, "waiting": 1}
    # actor/0 restarted: its new incarnation recovered `a` admitted and `b` ended
    got = pools.sync("actor/0", 2, {"q": {"held": ["a"], "waiting": [["c", "t"]]}}, t0 + 10)
    assert got == [("actor/0", "q", "c")]
    # two actors report after a restart of the scheduler, actor/0 first: its waiting run does not
    # take the place actor/1 still holds (the wait for the holders' reports)
    pools = QueuePools(parse_queues("q=2"), t0)
    assert pools.sync("actor/0", 1, {"q": {"held": ["a"], "waiting": [["c", "t"]]}}, t0 + 0.5) == []
    assert pools.tick(t0 + 1) == []
    assert pools.sync("actor/1", 1, {"q": {"held": ["b"], "waiting": []}}, t0 + 1.5) == []
    assert pools.tick(t0 + ADOPT_SECS + 1) == []          # a and b hold both places
    assert pools.release("q", "a", t0 + ADOPT_SECS + 2) == [("actor/0", "q", "c")]
    # actor/1 stalled for a minute: its run still holds its place, whatever waits
    assert pools.request("q", "d", "actor/0", "t", t0 + 6) == []
    for t in range(8, 68, 2):
        assert pools.sync("actor/0", 1, {"q": {"held": ["c"], "waiting": [["d", "t"]]}}, t0 + t) == []
        assert pools.tick(t0 + t + 1) == []
    # a report that is not what a sync holds is passed over, not a crash
    assert pools.sync("actor/1", 1, {"q": {"held": [1, "z"], "waiting": [["y"], "x", ["w", 2]]}}, t0 + 11) == []
    assert pools.sync("actor/1", 1, {"q": "junk"}, t0 + 12) == []


def test_lower_priority_numbers_go_first_and_tenants_take_turns_among_equals():
    t0 = 100.0
    pools = QueuePools(parse_queues("q=1"), t0)
    t1 = t0 + ADOPT_SECS
    assert pools.request("q", "a", "actor/0", "w", t1) == [("actor/0", "q", "a")]
    for run_id, tenant, priority in (("b", "x", 5), ("c", "y", 1), ("d", "x", 1), ("c2", "y", 1), ("e", "z", 0)):
        assert pools.request("q", run_id, "actor/0", tenant, t1, priority) == []
    order = []
    for n, run_id in enumerate(["a", "e", "c", "d", "c2", "b"]):
        order += [g[2] for g in pools.release("q", run_id, t1 + 1 + n)]
    assert order == ["e", "c", "d", "c2", "b"]
    # a new scheduler learns a waiter's priority from its actor's report
    pools = QueuePools(parse_queues("q=1"), t0)
    assert pools.sync("actor/0", 1, {"q": {"held": ["h"], "waiting": [["late", "t", 3], ["soon", "t"]]}}, t0) == []
    assert pools.release("q", "h", t1) == [("actor/0", "q", "soon")]
    assert pools.sync("actor/0", 1, {"q": {"held": [], "waiting": [["bad", "t", "high"]]}}, t1) == []   # passed over


def test_a_queue_per_key_keeps_its_limit_for_each_key_and_forgets_a_key_with_nothing_left():
    t0 = 100.0
    specs = parse_queues("users=1 per key, plain=1, fair=2 per tenant")
    assert place_of(specs, "users", "alice", "t") == "users/t/alice" and place_of(specs, "plain", "alice", "t") == "plain"
    assert place_of(specs, "gone", "alice", "t") == "gone" and place_of(specs, "fair", "", "acme") == "fair/acme"
    # a key is its tenant's: another tenant's "alice" is another place, and so is a key that
    # names a tenant and a key (a tenant's name holds no '/')
    assert place_of(specs, "users", "alice", "u") != place_of(specs, "users", "alice", "t")
    assert place_of(specs, "users", "acme/alice", "default") != place_of(specs, "users", "alice", "acme")
    pools = QueuePools(specs, t0)
    t1 = t0 + ADOPT_SECS
    got = [g for run_id, key, tenant in (("a1", "alice", "t"), ("a2", "alice", "t"), ("b1", "bob", "t"),
                                         ("u1", "alice", "u"))
           for g in pools.request(place_of(specs, "users", key, tenant), run_id, "actor/0", tenant, t1)]
    assert got == [("actor/0", "users/t/alice", "a1"), ("actor/0", "users/t/bob", "b1"),   # a key at a time each
                   ("actor/0", "users/u/alice", "u1")]
    assert pools.stats(t1)["users"] == {"limit": 1, "running": 3, "waiting": 1, "keys": 3}
    assert pools.release("users/t/alice", "a1", t1 + 1) == [("actor/0", "users/t/alice", "a2")]
    pools.release("users/t/bob", "b1", t1 + 1)
    pools.release("users/u/alice", "u1", t1 + 1)
    pools.tick(t1 + SWEEP_SECS)
    assert set(pools.pools) == {"plain", "users/t/alice"}   # bob's place is gone: nothing holds or waits there
    assert pools.stats(t1 + SWEEP_SECS)["users"]["keys"] == 1
    # a new scheduler makes a key's place from an actor's report of what it holds
    pools = QueuePools(specs, t0)
    assert pools.sync("actor/0", 1, {"users/carol": {"held": ["c1"], "waiting": [["c2", "t"]]}}, t0 + 1) == []
    assert pools.tick(t1 + 1) == [] and pools.release("users/carol", "c1", t1 + 2) == [("actor/0", "users/carol", "c2")]
    # a place the config no longer makes (a queue per key named without a key): no limit left
    assert pools.request("users", "x", "actor/0", "t", t1) == [("actor/0", "users", "x")]
    # a holder's sync that names nothing in a place it held: the place goes back (a release lost)
    pools = QueuePools(specs, t0)
    assert pools.request("users/dave", "d1", "actor/1", "t", t1) == [("actor/1", "users/dave", "d1")]
    assert pools.request("users/dave", "d2", "actor/0", "t", t1) == []
    assert pools.sync("actor/1", 1, {}, t1 + 1) == []    # a grant may still be on its way
    assert pools.sync("actor/1", 1, {}, t1 + 3) == [("actor/0", "users/dave", "d2")]
    # a new incarnation that names nothing: what the old one held goes back
    assert pools.request("users/dave", "d3", "actor/1", "t", t1 + 4) == []
    assert pools.sync("actor/0", 1, {"users/dave": {"held": ["d2"], "waiting": []}}, t1 + 5) == []
    assert pools.sync("actor/0", 2, {}, t1 + 6) == [("actor/1", "users/dave", "d3")]
    # per tenant: each tenant's runs keep to the limit apart
    got = [g[2] for run_id, tenant in (("a1", "acme"), ("a2", "acme"), ("a3", "acme"), ("b1", "bolt"))
           for g in pools.request(place_of(specs, "fair", "", tenant), run_id, "actor/0", tenant, t1)]
    assert got == ["a1", "a2", "b1"] and pools.stats(t1)["fair"] == {"limit": 2, "running": 3, "waiting": 1, "keys": 2}


def test_each_tenant_is_told_its_own_runs_among_a_queues_running_and_waiting():
    t0 = 100.0
    specs = parse_queues("q=2, users=1 per key, fair=1 per tenant")
    pools = QueuePools(specs, t0)
    t1 = t0 + ADOPT_SECS
    for run_id, tenant in (("a1", "acme"), ("b1", "bolt"), ("a2", "acme"), ("b2", "bolt"), ("a3", "acme")):
        pools.request("q", run_id, "actor/0", tenant, t1)
    assert pools.stats(t1, "acme")["q"] == {"limit": 2, "running": 2, "waiting": 3, "own_running": 1, "own_waiting": 2}
    assert pools.stats(t1, "bolt")["q"] == {"limit": 2, "running": 2, "waiting": 3, "own_running": 1, "own_waiting": 1}
    assert pools.stats(t1, "nobody")["q"]["own_running"] == pools.stats(t1, "nobody")["q"]["own_waiting"] == 0
    assert "own_running" not in pools.stats(t1)["q"]   # no tenant asked (agent-os status): the totals alone
    pools.release("q", "a1", t1 + 1)   # b1 and a2 run now
    assert (pools.stats(t1 + 1, "acme")["q"]["own_running"], pools.stats(t1 + 1, "acme")["q"]["own_waiting"]) == (1, 1)
    # a key's place and a tenant's place are that tenant's
    for run_id, place, tenant in (("u1", "users/acme/alice", "acme"), ("u2", "users/acme/alice", "acme"),
                                  ("u3", "users/bolt/alice", "bolt"), ("f1", "fair/bolt", "bolt"),
                                  ("f2", "fair/bolt", "bolt")):
        pools.request(place, run_id, "actor/0", tenant, t1)
    acme, bolt = pools.stats(t1, "acme"), pools.stats(t1, "bolt")
    assert (acme["users"]["own_running"], acme["users"]["own_waiting"], acme["fair"]["own_running"]) == (1, 1, 0)
    assert (bolt["users"]["own_running"], bolt["users"]["own_waiting"]) == (1, 0)
    assert (bolt["fair"]["own_running"], bolt["fair"]["own_waiting"]) == (1, 1)
    # a new scheduler learns whose each held run is from its actors' reports
    pools = QueuePools(specs, t0)
    report = {"q": {"held": [["a1", "acme"], ["b1", "bolt"]], "waiting": [["a2", "acme"]]}}
    assert pools.sync("actor/0", 1, report, t0 + 1) == []
    assert pools.stats(t0 + 1, "acme")["q"] == {"limit": 2, "running": 2, "waiting": 1, "own_running": 1,
                                                "own_waiting": 1}
    assert pools.stats(t0 + 1, "bolt")["q"]["own_running"] == 1


def test_a_rate_admits_no_more_in_any_window_than_it_allows_whatever_places_are_free():
    t0 = 100.0
    pools = QueuePools(parse_queues("r=*@2/1s, both=2@3/10s"), t0)
    for i in range(5):
        pools.request("r", f"r{i}", "actor/0", "t", t0)
    t1 = t0 + ADOPT_SECS
    assert pools.tick(t1) == [("actor/0", "r", "r0"), ("actor/0", "r", "r1")]
    pools.release("r", "r0", t1 + 0.1)
    pools.release("r", "r1", t1 + 0.1)
    assert pools.tick(t1 + 0.5) == [] and pools.stats(t1 + 0.5)["r"] == {
        "limit": None, "running": 0, "waiting": 3, "started_in_window": 2}   # free places, no starts left
    assert pools.request("r", "r1", "actor/0", "t", t1 + 0.6) == []   # an ended run asking again is a new start
    assert pools.tick(t1 + 1.0) == [("actor/0", "r", "r2"), ("actor/0", "r", "r3")]
    assert pools.request("r", "r2", "actor/0", "t", t1 + 1.1) == [("actor/0", "r", "r2")]   # a re-sent request
    assert pools.stats(t1 + 1.1)["r"]["started_in_window"] == 2
    assert pools.tick(t1 + 2.0) == [("actor/0", "r", "r4"), ("actor/0", "r", "r1")]
    # a limit and a rate: whichever is reached first
    got = [g for i in range(5) for g in pools.request("both", f"b{i}", "actor/0", "t", t1)]
    assert [g[2] for g in got] == ["b0", "b1"]
    assert [g[2] for g in pools.release("both", "b0", t1 + 0.2)] == ["b2"]
    assert pools.release("both", "b1", t1 + 0.3) == [] and pools.tick(t1 + 9.95) == []
    assert [g[2] for g in pools.tick(t1 + 10.05)] == ["b3"]   # b0's start left the window
    # a place freed while the window is full: time lets the next in once the window moves on
    pools = QueuePools(parse_queues("slow=1@1/10s"), t0)
    assert pools.request("slow", "s1", "actor/0", "t", t1) == [("actor/0", "slow", "s1")]
    assert pools.request("slow", "s2", "actor/0", "t", t1) == [] and pools.tick(t1 + 0.1) == []
    assert pools.release("slow", "s1", t1 + 1) == [] and pools.tick(t1 + 5) == []
    assert pools.tick(t1 + 10.05) == [("actor/0", "slow", "s2")]


def test_a_new_scheduler_counts_the_admissions_its_holders_report_in_the_rates_window():
    t0 = 100.0
    pools = QueuePools(parse_queues("r=*@2/10s"), t0)
    # actor/0 admitted `a` 1 s ago (it ended since), `old` 20 s ago; it waits with two runs
    report = {"r": {"held": [], "waiting": [["c", "t"], ["d", "t"]], "started": [["a", 1.0], ["old", 20.0]]}}
    assert pools.sync("actor/0", 1, report, t0 + 0.5) == []
    assert pools.sync("actor/0", 1, report, t0 + 0.6) == []   # reported again: counted once
    assert pools.tick(t0 + ADOPT_SECS) == [("actor/0", "r", "c")]
    assert pools.tick(t0 + 9.4) == [] and pools.tick(t0 + 9.6) == [("actor/0", "r", "d")]   # `a`'s 10 s are over
    # a report that is not a start passed over, not a crash
    junk = {"r": {"held": [], "waiting": [], "started": [["z"], ["y", "x"], ["w", float("nan")], "v", [1, 2]]}}
    assert pools.sync("actor/1", 1, junk, t0 + 9.7) == [] and pools.stats(t0 + 9.7)["r"]["started_in_window"] == 2


def test_an_enqueued_run_is_admitted_on_its_grant_journaled_before_it_runs_and_its_end_gives_the_place_back():
    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 3
        await flows.handlers()[Kind.FLOW_START](start({"flow": "f", "input": 1, "run_id": "q-1", "tenant": "t",
                                                       "queue": "q", "timeout_secs": 5, "new": True}))
        reply = bus.sent[-1][2]
        assert reply["status"] == "enqueued" and reply["queue"] == "q" and "timeout_at" not in reply
        assert sent(bus, Kind.QUEUE_REQUEST) == [{"queue": "q", "run_id": "q-1", "tenant": "t"}]
        assert not [b for b in sent(bus, Kind.TASK_SUBMIT) if b["run_id"] == "q-1"]
        run = flows.runs["q-1"]
        flows.dispatch(run)   # what a watchdog or a lost execution would do: it asks again, it does not run
        assert len(sent(bus, Kind.QUEUE_REQUEST)) == 2 and not sent(bus, Kind.TASK_SUBMIT)

        flows.sync_queues()
        assert sent(bus, Kind.QUEUE_SYNC)[-1] == {"queues": {"q": {"held": [], "waiting": [["q-1", "t"]]}},
                                                  "incarnation": 3}
        grant = Message("scheduler#1", Kind.QUEUE_GRANT, 5, time.time(), 0, "q-1", "",
                        {"queue": "q", "run_id": "q-1", "window_secs": 30})
        flows.on_queue_grant(grant)
        flows.on_queue_grant(grant)   # sent again
        await asyncio.sleep(0.05)
        types = [b["type"] for b in log.appended if b["run"] == "q-1"]
        assert types == ["run.started", "run.admitted"]
        (submit,) = [b for b in sent(bus, Kind.TASK_SUBMIT) if b["run_id"] == "q-1"]
        assert run.summary()["status"] == "running" and run.timeout_at == pytest.approx(run.admitted_at + 5)
        assert run.summary()["admitted_at"] == run.admitted_at
        flows.sync_queues()
        synced = sent(bus, Kind.QUEUE_SYNC)[-1]["queues"]["q"]
        assert synced["held"] == [["q-1", "t"]] and synced["waiting"] == []   # whose it is: a new scheduler counts it
        # the queue's rate: the admission is reported, with its age, for the window the grant told
        ((started, age),) = synced["started"]
        assert started == "q-1" and 0 <= age < 5

        # replayed (a restart): admitted, so not queued again
        again = replay("q-1", list(log.appended))
        assert again.admitted_at and not again.waits_in_queue() and flows.blocked_on(again) is None

        # a start with a priority asks with it, and says it while it waits
        await flows.handlers()[Kind.FLOW_START](start({"flow": "f", "input": 2, "run_id": "q-2", "tenant": "t",
                                                       "queue": "q", "priority": 7, "new": True}))
        assert bus.sent[-1][2]["priority"] == 7 and sent(bus, Kind.QUEUE_REQUEST)[-1]["priority"] == 7
        flows.sync_queues()
        assert sent(bus, Kind.QUEUE_SYNC)[-1]["queues"]["q"]["waiting"] == [["q-2", "t", 7]]
        assert replay("q-2", [b for b in log.appended if b["run"] == "q-2"]).priority == 7

        await flows.end(run, "completed", result=1)
        await asyncio.sleep(0.01)
        assert sent(bus, Kind.QUEUE_RELEASE) == [{"queue": "q", "run_id": "q-1"}]
        flows.on_queue_grant(grant)   # a grant for a run that ended: given back at once
        assert len(sent(bus, Kind.QUEUE_RELEASE)) == 2
        flows.sync_queues()   # ended, its admission still counts in the window
        assert [s[0] for s in sent(bus, Kind.QUEUE_SYNC)[-1]["queues"]["q"]["started"]] == ["q-1"]
        flows.queue_starts["q-1"] = ("q", time.time() - 31, 30.0)
        flows.sync_queues()   # and no more once the window is over
        assert "q-1" not in repr(sent(bus, Kind.QUEUE_SYNC)[-1]["queues"])

    asyncio.run(main())
