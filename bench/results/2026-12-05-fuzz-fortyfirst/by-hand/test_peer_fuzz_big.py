"""By hand: every role gets bodies that pass each kind's spec (right top-level types) but carry
edge values and junk nested content; nobody may crash or restart, and a turn still completes."""
import json
import os
import random
import subprocess
import time

import zmq

from broker import codec
from broker.protocol import SPECS, Kind
from harness import turn

ROLES = ["broker", "gateway/0", "actor/0", "actor/1", "scheduler", "writer/log/0", "writer/store"]
SKIP = {Kind.BATCH}
N = int(os.environ.get("N", "20"))


def junk(rng, depth=0):
    pick = rng.randrange(9 if depth < 2 else 6)
    if pick == 0: return rng.choice([0, -1, 1, 2**31, -2**63, 2**64 - 1, 7])
    if pick == 1: return rng.choice(["", "x", "a" * 5000, "../../etc", "\x00", "actor/0", "s-1", "é", "writer/log/0"])
    if pick == 2: return rng.choice([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e308, 0.001])
    if pick == 3: return rng.choice([True, False, None])
    if pick == 4: return rng.choice([b"", b"\x00" * 10, os.urandom(40)])
    if pick == 5: return rng.choice([[], {}, "", 0])
    if pick == 6: return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["x", "id", "kind", "seq", "key", "value", "name", "role", "records", "body", "ids"]):
            junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def value_of(rng, types):
    types = types if isinstance(types, tuple) else (types,)
    t = rng.choice(types)
    for _ in range(50):
        v = junk(rng)
        if isinstance(v, t) and not (t is int and isinstance(v, bool)):
            return v
    return t()


def body_for(rng, spec):
    body = {name: value_of(rng, types) for name, types in spec.required.items()}
    for name, types in spec.optional.items():
        if rng.random() < 0.5:
            body[name] = value_of(rng, types)
    if rng.random() < 0.3:
        body[rng.choice(["extra", "x"])] = junk(rng)
    return body


def test_structured_junk_to_every_role(make_server):
    server = make_server()
    server.remember_pids()
    before = {name: server.pid(name) for name in ROLES}
    ctx = zmq.Context()
    rng = random.Random(int(os.environ.get("SEED", "1")))
    sent = 0
    try:
        fuzz = ctx.socket(zmq.DEALER)
        fuzz.setsockopt(zmq.ROUTING_ID, b"fuzz/0#1")
        fuzz.setsockopt(zmq.LINGER, 0)
        fuzz.setsockopt(zmq.SNDHWM, 1000000)
        fuzz.connect(f"ipc://{server.rundir}/broker.sock")
        for kind, spec in SPECS.items():
            if kind in SKIP:
                continue
            for name in ROLES:
                for _ in range(N):
                    try:
                        env = codec.encode(name, kind, body_for(rng, spec), id=rng.choice([0, 1, sent + 2]),
                                           reply_to=rng.choice([0, 1, 99]), session=rng.choice(["", "s-1", "x" * 50]),
                                           turn=rng.choice(["", "t-1"]))
                    except Exception:
                        continue
                    fuzz.send(env)
                    sent += 1
                    while fuzz.poll(0, zmq.POLLIN):
                        fuzz.recv()
            time.sleep(0.02)
        time.sleep(3)
        fuzz.close(0)
    finally:
        ctx.term()
    print("SENT", sent)
    time.sleep(2)
    rows = {r["name"]: r for r in json.loads(server.cli("status", "--json").stdout)["processes"]}
    after = {name: rows[name]["pid"] for name in before}
    print("PIDS", before == after, {k: (before[k], after[k]) for k in before if before[k] != after[k]})
    out = subprocess.run(f"grep -rh -E 'ERROR|CRITICAL|Traceback|Error:' {server.work_dir} ",
                         shell=True, capture_output=True, text=True).stdout
    print(out)
    result = turn(server.url, "after-fuzz", "still fine?")
    print("TURN", result.terminal)
    assert before == after and result.terminal == "turn.completed"
