"""End-to-end: the bus off one host (tcp with CURVE: unknown keys are refused) and every role
under a fuzzer (random, oversized and malformed frames): all stay up and count what they drop."""
import json
import os
import subprocess
import sys
import random

import msgpack
import zmq
import zmq.auth

from broker import codec
from broker.bodies import SPECS
from broker.protocol import Kind
from harness import REPO, get_json, turn, wait_until
from storage.log_inbox import frame

ROLES = ["gateway/0", "actor/0", "actor/1", "scheduler", "writer/log/0", "writer/store"]


def send_if_connected(sock, frame) -> None:
    """Send without waiting: a refused handshake may leave the socket no connection to queue on
    (a blocking send then waited for good, and the test for its whole timeout)."""
    try:
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        pass


def test_tcp_with_curve_serves_known_keys_and_refuses_others(make_server, make_worker, tmp_path):
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "-m", "agentos.cli", "keys", "--dir", str(keys), "--client", "worker1"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    server = make_server({"broker": {"transport": "tcp", "listen": "127.0.0.1:0", "trace_listen": "127.0.0.1:0",
                                     "keys_dir": str(keys)}})
    assert turn(server.url, "over-tcp", "hello").terminal == "turn.completed"
    # a remote worker: its own key (`agent-os keys --client worker1`), named in broker.client_key
    make_worker(server, env={"AGENTOS_BROKER_CLIENT_KEY": "worker1"})
    status, _, run = get_json(f"{server.url}/v1/flows/async_steps/runs", method="POST", body=b'{"input": 4}',
                              headers={"Content-Type": "application/json"})
    assert status == 201
    done = get_json(f"{server.url}/v1/runs/{run['run_id']}?wait=20")[2]
    assert (done["status"], done["result"]) == ("completed", 12)
    port = int((server.rundir / "broker-bus.port").read_text())

    ctx = zmq.Context()
    try:
        rogue = ctx.socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()        # a key nobody authorized
        server_public = zmq.auth.load_certificate(keys / "server.key")[0]
        rogue.curve_publickey, rogue.curve_secretkey, rogue.curve_serverkey = public, secret, server_public
        rogue.setsockopt(zmq.ROUTING_ID, b"rogue/0#1")
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(f"tcp://127.0.0.1:{port}")
        send_if_connected(rogue, codec.encode("broker", Kind.PEERS, {}, id=1))
        assert rogue.poll(2000) == 0   # refused: no answer, ever
        plain = ctx.socket(zmq.DEALER)  # no CURVE at all
        plain.setsockopt(zmq.LINGER, 0)
        plain.setsockopt(zmq.ROUTING_ID, b"plain/0#1")
        plain.connect(f"tcp://127.0.0.1:{port}")
        send_if_connected(plain, codec.encode("broker", Kind.PEERS, {}, id=1))
        assert plain.poll(1000) == 0
        # A remote worker's key may name a worker (or a command-line tool), not a role of the node:
        # as the supervisor it could drain the gateway, as a log writer fence it.
        public, secret = zmq.auth.load_certificate(keys / "worker1.key_secret")

        def remote(identity):
            sock = ctx.socket(zmq.DEALER)
            sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
            sock.setsockopt(zmq.ROUTING_ID, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            return sock

        posing = remote(b"supervisor#999")
        posing.send(codec.encode("gateway/0", Kind.DRAIN, {"deadline_secs": 0.0}, id=1))
        posing.send(codec.encode("broker", Kind.PEERS, {}, id=2))
        assert posing.poll(2000) == 0      # dropped at the broker: no drain, no answer
        wait_until(lambda: "a peer with the key" in server.log(), 10, "the broker to say why")
        assert turn(server.url, "over-tcp-2", "still serving").terminal == "turn.completed"
        as_worker = remote(b"worker/elsewhere-1#1")
        as_worker.send(codec.encode("broker", Kind.PEERS, {}, id=1))
        assert as_worker.poll(5000) and codec.decode(as_worker.recv()).kind == Kind.PEERS_REPLY
        # The trace tap shows every tenant's sessions and turns: the node's own key reads it, a
        # remote worker's key is refused.
        trace_port = int((server.rundir / "broker-trace.port").read_text())
        tappers = {}
        for who, key_file in (("node", "client.key_secret"), ("worker", "worker1.key_secret")):
            tap = ctx.socket(zmq.SUB)
            tap.curve_publickey, tap.curve_secretkey = zmq.auth.load_certificate(keys / key_file)
            tap.curve_serverkey = server_public
            tap.setsockopt(zmq.LINGER, 0)
            tap.setsockopt(zmq.SUBSCRIBE, b"")
            tap.connect(f"tcp://127.0.0.1:{trace_port}")
            tappers[who] = tap
        for n in range(20):
            assert turn(server.url, f"traced-{n}", "hi").terminal == "turn.completed"
            if tappers["node"].poll(500):
                break
        else:
            raise AssertionError("the node's own key read nothing on the trace tap")
        assert codec.decode_trace_record(tappers["node"].recv())[0]
        assert turn(server.url, "traced-more", "hi").terminal == "turn.completed"
        assert tappers["worker"].poll(1000) == 0
        for sock in (rogue, plain, posing, as_worker, *tappers.values()):
            sock.close(0)
        refused = subprocess.run([sys.executable, "-m", "agentos.cli", "trace", "--timeout", "20", "--config",
                                  str(server.config_path)], cwd=REPO, capture_output=True, text=True, timeout=40,
                                 env={**server.env, "AGENTOS_BROKER_CLIENT_KEY": "worker1"})
        assert refused.returncode == 2 and "refused this key (worker1)" in refused.stderr, refused
        tracing = subprocess.Popen([sys.executable, "-m", "agentos.cli", "trace", "--kind", "turn.", "--count", "1",
                                    "--timeout", "30", "--config", str(server.config_path)], cwd=REPO, env=server.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for n in range(40):
                turn(server.url, f"traced-cli-{n}", "hi")
                if tracing.poll() is not None:
                    break
            out, err = tracing.communicate(timeout=30)
        finally:
            tracing.kill()
        assert tracing.returncode == 0 and "session=traced-cli-" in out, (out, err)
    finally:
        ctx.destroy(0)   # closes what an assertion left open: term() would wait for it
    peers = json.loads(server.cli("status", "--json").stdout)
    assert peers["running"] and all(r["restarts"] == 0 for r in peers["processes"])


def _fuzzer(ctx, server):
    """A peer on the tree's bus that is none of its roles."""
    fuzz = ctx.socket(zmq.DEALER)
    fuzz.setsockopt(zmq.ROUTING_ID, b"fuzz/0#1")
    fuzz.setsockopt(zmq.LINGER, 0)
    fuzz.setsockopt(zmq.SNDHWM, 100000)
    fuzz.connect(f"ipc://{server.rundir}/broker.sock")
    return fuzz


def test_random_and_oversized_frames_to_every_role(make_server):
    server = make_server()
    server.remember_pids()
    before = {name: server.pid(name) for name in ["broker", *ROLES]}
    ctx = zmq.Context()
    try:
        fuzz = _fuzzer(ctx, server)
        rng = random.Random(7)
        kinds = [k.value.encode() for k in Kind]
        for _ in range(300):   # random bytes to the broker
            fuzz.send(os.urandom(rng.randint(0, 300)))
        for name in ["broker", *ROLES]:   # well routed, garbage inside: the role must count and drop it
            for _ in range(40):
                kind = rng.choice(kinds + [os.urandom(8)])
                header = rng.choice([msgpack.packb([1, 0.0, 0, "", ""]), os.urandom(12), msgpack.packb("x")])
                body = rng.choice([os.urandom(rng.randint(0, 64)), msgpack.packb({"x": 1}), msgpack.packb([1, 2]),
                                   msgpack.packb({"turn_id": 5, "seq": "x", "session": None})])
                fuzz.send(codec.name_prefix(name) + bytes([len(kind)]) + kind + len(header).to_bytes(2, "little")
                          + header + body)
            fuzz.send_multipart([b"AOS/1", name.encode(), b"multi", b"part"])
        fuzz.send(b"AOS/1\x06broker" + b"\x00" * (65 << 20))   # over the bus's 64 MiB message limit
        fuzz.close(0)
    finally:
        ctx.destroy(0)   # closes what an assertion left open: term() would wait for it

    def counted():
        rows = {r["name"]: r for r in server.status()["processes"]}
        if rows["broker"]["stats"].get("malformed", 0) < 300:
            return False
        return all(rows[name]["stats"].get("bus", {}).get("malformed", 0) > 0 for name in ROLES) and rows
    rows = wait_until(counted, 20, "every role to count the malformed messages", interval=0.5)
    assert {name: rows[name]["pid"] for name in before} == before   # nobody crashed or restarted
    assert turn(server.url, "after-fuzz", "still fine?").terminal == "turn.completed"


def test_garbage_on_a_writers_direct_inbox_closes_that_connection_only(make_server):
    import socket
    server = make_server()
    pid = server.pid("writer/log/0")
    path = str(server.rundir / "log-0.sock")
    rng = random.Random(11)
    attempts = [b"\x00\x00\x00\x05hello",                                   # not a bus identity
                (70 << 20).to_bytes(4, "big"),                              # a frame over 64 MiB
                frame(b"fuzz/0#1") + frame(os.urandom(40)),                  # a bad envelope
                frame(b"fuzz/0#1") + frame(codec.encode("writer/log/1", Kind.LOG_APPEND, {"records": []}, id=1)),
                os.urandom(300)]
    attempts += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))) for _ in range(20)]
    for data in attempts:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(100) == b""   # nothing answered; closed (at once, or at our EOF)
    rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
    assert rows["writer/log/0"]["pid"] == pid and rows["writer/log/0"]["stats"]["direct"]["malformed"] >= 4
    # Real appends still take the direct path.
    assert turn(server.url, "after-inbox-fuzz", "still fine?").terminal == "turn.completed"
    rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
    assert rows["writer/log/0"]["stats"]["direct"]["received"] > 0


def _junk(rng, depth=0):
    pick = rng.randrange(8 if depth < 2 else 6)
    if pick == 0:
        return rng.choice([0, -1, 7, 2**31, -2**63, 2**64 - 1])
    if pick == 1:
        return rng.choice(["", "x", "a" * 5000, "../../etc", "\x00", "actor/0", "writer/log/0", "é"])
    if pick == 2:
        return rng.choice([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e308])
    if pick == 3:
        return rng.choice([True, False, b"", os.urandom(24)])
    if pick in (4, 5):
        return rng.choice([[], {}, [None], [[1, 2]], ["x"]])
    if pick == 6:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["x", "id", "seq", "key", "value", "role", "records"]): _junk(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def _junk_of(rng, types):
    want = rng.choice(types if isinstance(types, tuple) else (types,))
    for _ in range(100):
        value = _junk(rng)
        if isinstance(value, want) and not (want is int and isinstance(value, bool)):
            return value
    return want()


def test_bodies_that_pass_the_spec_with_junk_values_to_every_role(make_server):
    """Every kind, its fields of the right types but with edge and junk values (NaN, 2**64-1, lists
    of nothing in particular), from a peer that is no role, to every role. Such a fuzzer once
    drained the gateway, fenced the log writer, stopped writer/store's loader behind a record it
    could not load and paused every provider permit: nobody crashed, and nothing worked after."""
    server = make_server()
    server.remember_pids()
    names = ["broker", *ROLES]
    before = {name: server.pid(name) for name in names}
    rng = random.Random(11)
    ctx = zmq.Context()
    try:
        fuzz = _fuzzer(ctx, server)
        for kind, spec in SPECS.items():
            if kind is Kind.BATCH:
                continue
            for name in names:
                for i in range(8):
                    body = {field: _junk_of(rng, types) for field, types in spec.required.items()}
                    body.update({field: _junk_of(rng, types) for field, types in spec.optional.items()
                                 if rng.random() < 0.5})
                    fuzz.send(codec.encode(name, kind, body, id=rng.choice([1, i + 2]), reply_to=rng.choice([0, 1]),
                                           session=rng.choice(["", "s-1"])))
                    while fuzz.poll(0, zmq.POLLIN):
                        fuzz.recv()
        fuzz.close(0)
    finally:
        ctx.destroy(0)   # closes what an assertion left open: term() would wait for it

    def dropped_by_all():   # each role drops the kinds only another role may send it: all of it was read
        rows = {r["name"]: r for r in server.status()["processes"]}
        return all(rows[name]["stats"].get("bus", {}).get("malformed", 0) > 0 for name in ROLES)
    wait_until(dropped_by_all, 20, "every role to drop what only another role may send", interval=0.5)
    answer = turn(server.url, "after-junk", "still fine?")   # gateway, actor, permits, log, store
    assert answer.terminal == "turn.completed", answer
    status, _, transcript = get_json(f"{server.url}/v1/sessions/after-junk/messages")
    assert status == 200 and [m["role"] for m in transcript["messages"]] == ["user", "assistant"]
    rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
    assert {name: rows[name]["pid"] for name in names} == before   # nobody crashed or restarted
    # a handler's error, a task of one that died unseen, a lifelong loop that died
    errors = [line for line in server.log().splitlines()
              if "ERROR handler" in line or "never retrieved" in line or " CRITICAL " in line]
    assert not errors, errors[:5]
