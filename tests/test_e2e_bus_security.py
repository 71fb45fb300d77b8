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
from broker.protocol import Kind
from harness import REPO, get_json, turn, wait_until
from storage.log_inbox import frame

ROLES = ["gateway/0", "actor/0", "actor/1", "scheduler", "writer/log/0", "writer/store"]


def test_tcp_with_curve_serves_known_keys_and_refuses_others(make_server, make_worker, tmp_path):
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "-m", "agentos.cli", "keys", "--dir", str(keys), "--client", "worker1"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    server = make_server({"broker": {"transport": "tcp", "listen": "127.0.0.1:0", "trace_listen": "127.0.0.1:0",
                                     "keys_dir": str(keys)}})
    assert turn(server.url, "over-tcp", "hello").terminal == "turn.completed"
    make_worker(server)   # the worker connects over tcp with the node's client key
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
        rogue.send(codec.encode("broker", Kind.PEERS, {}, id=1))
        assert rogue.poll(2000) == 0   # refused: no answer, ever
        plain = ctx.socket(zmq.DEALER)  # no CURVE at all
        plain.setsockopt(zmq.LINGER, 0)
        plain.setsockopt(zmq.ROUTING_ID, b"plain/0#1")
        plain.connect(f"tcp://127.0.0.1:{port}")
        plain.send(codec.encode("broker", Kind.PEERS, {}, id=1))
        assert plain.poll(1000) == 0
        for sock in (rogue, plain):
            sock.close(0)
    finally:
        ctx.term()
    peers = json.loads(server.cli("status", "--json").stdout)
    assert peers["running"] and all(r["restarts"] == 0 for r in peers["processes"])


def test_random_and_oversized_frames_to_every_role(make_server):
    server = make_server()
    server.remember_pids()
    before = {name: server.pid(name) for name in ["broker", *ROLES]}
    ctx = zmq.Context()
    try:
        fuzz = ctx.socket(zmq.DEALER)
        fuzz.setsockopt(zmq.ROUTING_ID, b"fuzz/0#1")
        fuzz.setsockopt(zmq.LINGER, 0)
        fuzz.setsockopt(zmq.SNDHWM, 100000)
        fuzz.connect(f"ipc://{server.rundir}/broker.sock")
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
        ctx.term()

    def counted():
        rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
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
