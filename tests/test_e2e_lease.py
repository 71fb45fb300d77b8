"""End-to-end on a real S3 endpoint (moto's server): the cluster lease a node acknowledges under.
A node whose lease another took acknowledges nothing more and stops (fencing); one whose lease
was not renewed in time (its supervisor stalled) holds its `s3` acks until the next renewal, and
says so. Takeover by a standby is in test_e2e_s3.py."""
import json
import os
import re
import time

import botocore.exceptions

from harness import pid_alive, wait_until
from bench.failover import latest_key as latest, put


def test_a_node_whose_lease_was_taken_acknowledges_nothing_more(make_s3_server, s3):
    bucket = s3.new_bucket()
    node = make_s3_server(bucket, "fenced", durability="local")
    assert put(node.url, "fence", "k0", b"before") == 200
    client = s3.client()
    for _ in range(20):   # the node renews every second: a renewal between our read and write wins
        current = client.get_object(Bucket=bucket, Key="lease.json")
        lease = json.loads(current["Body"].read())
        try:
            client.put_object(Bucket=bucket, Key="lease.json", IfMatch=current["ETag"],
                              Body=json.dumps({"node": "usurper", "epoch": lease["epoch"] + 1,
                                               "expires_at": time.time() + 60}).encode())
            break
        except botocore.exceptions.ClientError as exc:
            assert exc.response["Error"]["Code"] == "PreconditionFailed", exc
    else:
        raise AssertionError("could not take the lease in 20 tries")
    taken_at = time.monotonic()
    wait_until(lambda: "the cluster lease was taken" in node.log(), 10, "the node to notice")
    # The supervisor tells the writers over the bus, once, and stops the tree. The PUTs go to the
    # gateway's own log: wait until the gateway has the news, or the tree is gone (a gateway that
    # started a moment before may not hear it; until then an ack is as good as one a moment earlier).
    wait_until(lambda: re.search(r"gateway/0 ERROR the cluster lease is lost", node.log())
               or node.proc.poll() is not None, 10, "the gateway's log to stop acknowledging")
    statuses = [put(node.url, "fence", f"after{i}", b"after", timeout=5) for i in range(3)]
    assert 200 not in statuses, statuses
    assert node.proc.wait(20) == 4          # EXIT_LEASE_LOST
    assert time.monotonic() - taken_at < 20
    assert not [p for p in node.seen_pids if pid_alive(p)] or wait_until(
        lambda: not [p for p in node.seen_pids if pid_alive(p)], 10, "the fenced tree to stop")



def test_a_stalled_supervisor_holds_s3_acks_until_its_next_renewal_and_the_log_says_so(make_s3_server, s3):
    """Stopped (a VM's pause, swapping), the supervisor renews no lease: the log writers'
    permission to acknowledge runs out and `s3` acks wait, with nothing failing and, before, nothing
    said. At its next renewal they are acknowledged, and the log says they were held and how long
    (found in a chaos run stalling the supervisor: bench/results/2026-12-05-chaos-stalls-supervisor-
    fortyfourth/)."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    node = make_s3_server(s3.new_bucket(), "stalled")
    assert put(node.url, "stall", "k0", b"before") == 200
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3.5)   # past the last renewal's 2 s of permission (a 3 s lease, 1 s kept in hand)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(put, node.url, "stall", "k1", b"during")
            time.sleep(1.5)
            assert not pending.done(), "acknowledged with the lease's permission run out"
            os.kill(node.proc.pid, signal.SIGCONT)
            assert pending.result(30) == 200
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    wait_until(lambda: re.search(r"WARNING acknowledgements held \d+\.\d s for the cluster lease's renewal",
                                 node.log()), 10, "the log to say the acks were held")
    assert latest(node.url, "stall") == b"during"
