"""Helpers of the tests on a small disk: a tmpfs for the block, checkpoints PUT until the disk
takes none, and what was acknowledged read back."""
import contextlib
import http.client
import itertools
import subprocess
import threading
import urllib.parse
import urllib.request

from harness import get_json, wait_until


@contextlib.contextmanager
def tmpfs(directory, size):
    """A tmpfs of `size` mounted on `directory` for the block (the test needs root)."""
    directory.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"this test mounts a tmpfs (it needs root): {proc.stderr}"
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def put(base, sid, key, payload):
    return get_json(f"{base}/v1/sessions/{sid}/checkpoints/{key}", method="PUT", body=payload)


FILL_CLIENTS = 4


def fill_with_checkpoints(base, hot_per_cold=1, cold_bytes=12000):
    """PUT checkpoints until the disk takes none: `hot_per_cold` of a hot session's (12 KB), each
    superseding the last, to one of a new session (`cold_bytes`). The new sessions' acknowledged
    ones. (A slow fill lets compaction passes run in it, each making room for more new sessions:
    small ones keep what the disk holds for good from filling it.)

    FILL_CLIENTS clients at once, each on a connection it keeps: one client alone, a connection a
    PUT, went slowly enough under the suite's load that compaction freed room about as fast as it
    filled it (4,734 PUTs over 17 s, where 1,102 fill the disk of the busiest test on a quiet machine)."""
    host = urllib.parse.urlsplit(base).netloc
    kept, lock, numbers, full = {}, threading.Lock(), itertools.count(), threading.Event()

    def client():
        conn = http.client.HTTPConnection(host, timeout=10)

        def send(sid, payload):
            nonlocal conn
            for attempt in range(2):
                try:
                    conn.request("PUT", f"/v1/sessions/{sid}/checkpoints/k", body=payload)
                    with conn.getresponse() as resp:
                        resp.read()
                        return resp.status
                except (http.client.HTTPException, ConnectionError):   # the server closed it: once more
                    conn.close()
                    conn = http.client.HTTPConnection(host, timeout=10)
                    if attempt:
                        raise
        try:
            while not full.is_set() and (i := next(numbers)) < 100_000:
                hot = {send("hot", b"%06d" % i + b"h" * 12000) for _ in range(hot_per_cold)}
                payload = b"%06d" % i + b"c" * cold_bytes
                cold = send(f"cold-{i}", payload)
                if cold == 200:
                    with lock:
                        kept[f"cold-{i}"] = payload
                if hot | {cold} == {507}:
                    full.set()
        finally:
            conn.close()
    clients = [threading.Thread(target=client) for _ in range(FILL_CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert full.is_set(), "the disk never filled"
    return kept


def put_new_sessions(base, count, timeout=30.0):
    """PUT a 12 KB checkpoint to each of `count` new sessions, each again until taken: the logs
    wait for writer/store where it shares their disk and is behind (507 meanwhile)."""
    taken = set()

    def all_taken():
        for n in range(count):
            if n not in taken and put(base, f"after-{n}", "k", b"a" * 12000)[0] == 200:
                taken.add(n)
        return len(taken) == count
    wait_until(all_taken, timeout, f"{count} new sessions' checkpoints to be taken", interval=0.5)


def wait_for_the_store(base, timeout=60.0):
    """Until writer/store has loaded all the logs held when asked: a list of sessions is answered
    once it has (read-your-writes). Its lag metric will not do: a store stopped, or starved, last
    reported it before it fell behind."""
    def caught_up():
        try:
            with urllib.request.urlopen(f"{base}/v1/sessions?limit=1", timeout=40) as resp:
                return resp.status == 200
        except (OSError, http.client.HTTPException):   # 503 while it loads, or our own timeout
            return False
    wait_until(caught_up, timeout, "writer/store to load the logs", interval=0.5)


def read_back(base, kept):
    """Every acknowledged checkpoint is there, and the hot session's newest is the one PUT after."""
    for sid, payload in kept.items():
        with urllib.request.urlopen(f"{base}/v1/sessions/{sid}/checkpoints/latest") as resp:
            assert resp.read() == payload
    with urllib.request.urlopen(f"{base}/v1/sessions/hot/checkpoints/latest") as resp:
        assert resp.read() == b"after" * 2400
