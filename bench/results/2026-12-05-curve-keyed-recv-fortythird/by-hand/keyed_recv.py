"""By hand: what reading each message's CURVE key (ZeroMQ's User-Id) costs the broker on a tcp bus.

One process: a ROUTER with CURVE and the ZAP authenticator (as broker/server.py sets them up), a
DEALER peer with an authorized key that queues N small envelopes, then the ROUTER drains them
with `frames.router_recv` (what ipc uses) or `frames.router_recv_keyed` (what tcp uses since
eb5520c), arms alternating, ROUNDS rounds. Reports µs per message of each arm, and of the key
check itself (`Broker.route_keyed`'s lookup and compare) on a dict the size of a busy tree's.

Run from the repository: `.venv/bin/python bench/results/2026-12-05-curve-keyed-recv-fortythird/by-hand/keyed_recv.py`
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
import zmq                                   # noqa: E402
import zmq.auth                              # noqa: E402
from zmq.auth.thread import ThreadAuthenticator   # noqa: E402

from broker import codec, frames             # noqa: E402
from broker.address import REMOTE_NAMES      # noqa: E402
from broker.protocol import Kind             # noqa: E402

N, ROUNDS = 100_000, 5


def main() -> int:
    keys = Path(tempfile.mkdtemp(prefix="curve-"))
    (keys / "authorized").mkdir()
    server_public, server_secret = zmq.auth.load_certificate(zmq.auth.create_certificates(keys, "server")[1])
    client_public, client_secret = zmq.auth.load_certificate(zmq.auth.create_certificates(keys, "client")[1])
    (keys / "client.key").rename(keys / "authorized" / "client.key")
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="agent-os", location=str(keys / "authorized"))
    router = ctx.socket(zmq.ROUTER)
    router.zap_domain = b"agent-os"
    router.curve_secretkey, router.curve_publickey, router.curve_server = server_secret, server_public, True
    router.setsockopt(zmq.RCVHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.curve_secretkey, dealer.curve_publickey, dealer.curve_serverkey = client_secret, client_public, server_public
    dealer.setsockopt(zmq.ROUTING_ID, b"actor/0#1")
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    envelope = codec.encode("gateway/0", Kind.HEARTBEAT, {})
    arms = {"router_recv": frames.router_recv, "router_recv_keyed": frames.router_recv_keyed}
    per_message: dict[str, list[float]] = {arm: [] for arm in arms}
    for round_ in range(ROUNDS):
        for arm in (arms if round_ % 2 == 0 else reversed(list(arms))):
            for _ in range(N):
                dealer.send(envelope)
            got = 0
            deadline = time.monotonic() + 30
            while not router.poll(1000) and time.monotonic() < deadline:
                pass
            began = time.perf_counter()
            recv = arms[arm]
            while got < N:
                try:
                    recv(router)
                    got += 1
                except zmq.Again:
                    router.poll(100)
            per_message[arm].append((time.perf_counter() - began) / N * 1e6)
    # the check itself: a dict of a busy tree's identities, the one asked for present
    key_of = {f"worker/host-{i}#1".encode(): "k" * 40 for i in range(2000)}
    identity, key = b"worker/host-1000#1", "k" * 40
    began = time.perf_counter()
    for _ in range(N):
        known = key_of.get(identity)
        if known != key and (known is not None or not identity.startswith(REMOTE_NAMES)):
            raise AssertionError
    check_us = (time.perf_counter() - began) / N * 1e6
    dealer.close(0)
    router.close(0)
    auth.stop()
    ctx.term()
    out = {"messages_per_round": N, "rounds": ROUNDS,
           "us_per_message": {arm: [round(v, 3) for v in values] for arm, values in per_message.items()},
           "median_us": {arm: round(statistics.median(values), 3) for arm, values in per_message.items()},
           "key_check_us": round(check_us, 3)}
    out["keyed_extra_us"] = round(out["median_us"]["router_recv_keyed"] - out["median_us"]["router_recv"], 3)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
