"""End-to-end: a second writer/log/0 started beside a running tree's (as a fork the fork server
made as it was killed would be) waits for the first to end and touches nothing meanwhile: the
log takes and keeps every checkpoint as before. It gave up on its own after a wait; two of them
once wrote one segment and damaged its records (agentos/role_lock.py)."""
import os
import subprocess
import sys
import urllib.request

from harness import REPO, get_json, wait_until


def test_a_second_log_writer_beside_a_live_one_waits_and_writes_nothing(make_server, tmp_path):
    server = make_server()
    first = server.pid("writer/log/0")
    out = tmp_path / "second.txt"
    with out.open("w") as sink:
        second = subprocess.Popen([sys.executable, "-m", "agentos.child", "writer-log", "0", str(server.rundir),
                                   str(os.getpid())], cwd=REPO, env=server.env, stdout=sink,
                                  stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: f"another writer/log/0 (pid {first}) holds" in out.read_text(), 30, "the second to wait")
        for i in range(20):
            status, _, _ = get_json(f"{server.url}/v1/sessions/dup-{i}/checkpoints/k", method="PUT",
                                    body=f"state {i}".encode())
            assert status in (200, 201)
        assert second.poll() is None   # still waiting, not serving
    finally:
        second.kill()
        second.wait()
    printed = out.read_text()
    assert "segment(s), end at position" not in printed   # it never opened the log
    for i in range(20):
        with urllib.request.urlopen(f"{server.url}/v1/sessions/dup-{i}/checkpoints/latest", timeout=10) as resp:
            assert resp.read() == f"state {i}".encode()
    assert server.pid("writer/log/0") == first and server.restarts("writer/log/0") == 0
    assert " ERROR " not in server.log()
