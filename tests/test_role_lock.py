"""One live process per role (agentos/role_lock.py), and the supervisor's strays
(agentos/strays.py): a second process of a role waits for the first and gives up while it lives;
a process of the tree that is not one of the supervisor's children is killed, anything else
that is its child is left alone."""
import json
import logging
import os
import subprocess
import sys

from agentos import role_lock
from agentos.rundir import RunDir
from harness import REPO

HOLD = """
import logging, sys, time
from agentos import role_lock
from agentos.rundir import RunDir
print(role_lock.hold(RunDir(sys.argv[1]), "writer/log/0", logging.getLogger("t")), flush=True)
time.sleep(60)
"""


def test_a_second_process_of_a_role_waits_for_the_first_and_gives_up_while_it_lives(tmp_path, caplog):
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "True"
        with caplog.at_level(logging.WARNING):
            assert role_lock.hold(RunDir(tmp_path), "writer/log/0", logging.getLogger("t"), wait_secs=0.3) is False
        assert f"another writer/log/0 (pid {first.pid}) holds" in caplog.text and "exiting" in caplog.text
        assert role_lock.hold(RunDir(tmp_path), "writer/log/1", logging.getLogger("t"), wait_secs=0.3)   # another role
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
    try:   # its lock went with it: the next one takes the role at once
        assert role_lock.hold(RunDir(tmp_path), "writer/log/0", logging.getLogger("t"), wait_secs=0.0)
    finally:
        for fd in role_lock._held:
            os.close(fd)
        role_lock._held.clear()


# In a process of its own: it kills among its own children, and becomes a subreaper.
STRAYS = r"""
import ctypes, json, logging, os, subprocess, sys, time
from agentos import strays
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER, as the supervisor
titled = "import setproctitle, time; setproctitle.setproctitle('agent-os: writer/log/0'); time.sleep(60)"
ours = subprocess.Popen([sys.executable, "-c", titled])
sidecar = subprocess.Popen(["sleep", "60"])   # a child that is not of the tree
# a stray: titled as ours, orphaned to us (its parent exits at once)
middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                           "'-c', sys.argv[1]]); print(p.pid, flush=True)", titled], stdout=subprocess.PIPE, text=True)
stray = int(middle.stdout.readline())
middle.wait()
deadline = time.monotonic() + 10
while open(f"/proc/{ours.pid}/cmdline", "rb").read(9) != b"agent-os:" or stray not in strays.children_of(os.getpid()) \
        or open(f"/proc/{stray}/cmdline", "rb").read(9) != b"agent-os:":
    assert time.monotonic() < deadline, "the stray to be ours, titled"
    time.sleep(0.05)
killed = strays.kill_strays({ours.pid}, logging.getLogger("t"))
time.sleep(0.2)
os.waitpid(stray, 0)
out = {"killed": killed, "stray": stray, "ours_alive": ours.poll() is None, "sidecar_alive": sidecar.poll() is None}
ours.kill(); sidecar.kill(); ours.wait(); sidecar.wait()
print(json.dumps(out))
"""


def test_the_supervisor_kills_a_stray_of_its_tree_and_nothing_else():
    proc = subprocess.run([sys.executable, "-c", STRAYS], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["killed"] == [out["stray"]], (out, proc.stderr)
    assert out["ours_alive"] and out["sidecar_alive"]
    assert "killed pid" in proc.stderr and "agent-os: writer/log/0" in proc.stderr
