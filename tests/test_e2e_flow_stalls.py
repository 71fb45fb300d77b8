"""End-to-end: flow runs whose actor stalls past the broker's peer timeout (`broker.peer_timeout_secs`)
while an ASYNC step's result is on its way: the broker bounces what is sent to a silent peer, and
the result must still be journaled once, the step never run again."""
import os
import signal
import time
from pathlib import Path

from agentos.config import BrokerConfig
from broker.sharding import actor_name
from harness import wait_until
from test_e2e_flows import lines, result, start


def test_an_async_result_sent_while_its_actor_was_stalled_is_journaled_and_not_run_again(make_server, make_worker,
                                                                                           tmp_path):
    """The broker bounces what is sent to a peer silent past `broker.peer_timeout_secs`: an ASYNC
    step's result, sent once, was lost to an actor stalled that long, the run's journal kept a
    hole, and its execution after the sleep ran the step again. Sent until taken, it still came
    too late under load: the actor, back from a stall longer than its watchdog's grace, took the
    execution for dead and dispatched the run anew first (here every time, with the 5.5 s stall)."""
    server = make_server()
    make_worker(server)
    effects, gate = tmp_path / "effects.txt", tmp_path / "gate"
    _, _, run = start(server.url, "async_then_sleep", {"file": str(effects), "gate": str(gate), "secs": 4})
    wait_until(lambda: lines(Path(f"{effects}.starts")), 30, "the ASYNC step to start")
    actor = server.pid(actor_name(run["run_id"], 2))
    os.kill(actor, signal.SIGSTOP)
    try:
        time.sleep(BrokerConfig().peer_timeout_secs + 0.5)
        gate.touch()                       # the step ends, its result goes to the stalled actor
        wait_until(lambda: lines(effects), 30, "the ASYNC step's effect")
        time.sleep(2.0)                    # the flow asks for its sleep (4 s: still due after this)
    finally:
        os.kill(actor, signal.SIGCONT)
    body = result(server.url, run["run_id"])
    assert body["status"] == "completed", body
    assert lines(effects) == ["step 0", "step 1"]       # the slow step once, then the quick one


def test_a_run_does_not_park_before_an_async_result_the_broker_bounced(make_server, make_worker, tmp_path):
    """A result the broker bounced (its actor stalled past the peer timeout) is sent again every
    half second. A sleep asked for just after the actor came back could reach it first: the run
    parked with a hole in its journal, and its execution after the sleep ran the step again. The
    worker now names the results it has no answer for, and the actor parks a run once they are in.
    Five runs whose results bounced a tenth of a second apart: whenever the actors come back, the
    next resend of some of them comes after their sleep's request."""
    server = make_server()
    make_worker(server, slots=5)
    runs = []
    for i in range(5):
        effects, gate, then = (tmp_path / f"{name}-{i}" for name in ("effects", "gate", "then"))
        _, _, run = start(server.url, "async_gate_sleep", {"file": str(effects), "gate": str(gate),
                                                           "then": str(then), "secs": 0.2})
        runs.append((run["run_id"], effects, gate, then))
    for _, effects, _, _ in runs:
        wait_until(lambda: lines(Path(f"{effects}.starts")), 30, "the ASYNC steps to start")
    actors = [server.pid(f"actor/{i}") for i in range(2)]   # the runs' ids fall to both
    for pid in actors:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(BrokerConfig().peer_timeout_secs + 0.5)
        for _, _, gate, _ in runs:         # the steps end; their results go to stalled actors
            gate.touch()
            time.sleep(0.1)
        for _, effects, _, _ in runs:
            wait_until(lambda: lines(effects), 30, "the ASYNC steps' effects")
        time.sleep(1.0)                    # each result is resent every half second by now
    finally:
        for pid in actors:
            os.kill(pid, signal.SIGCONT)
    time.sleep(0.05)
    for _, _, _, then in runs:             # each flow asks for its sleep
        then.touch()
    for run_id, effects, _, _ in runs:
        body = result(server.url, run_id)
        assert body["status"] == "completed", body
        assert lines(effects) == ["step 0", "step 1"], run_id   # the slow step once, then the quick one
