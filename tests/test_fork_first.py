"""The supervisor's first fork server is its own fork (agentos/forkserver.py `ForkServer.fork_first`):
made only from a process with no other thread and no running event loop (a fork copies a lock
another thread holds as held, for good), with its stdin on /dev/null as a server started with its
own interpreter has it. Run in a process of its own: the handle makes its process a subreaper."""
import json
import subprocess
import sys

from harness import REPO

SCRIPT = r"""
import asyncio, json, logging, os, threading
from agentos.forkserver import ForkServer

forks = ForkServer(dict(os.environ), logging.getLogger("test"), enabled=True)
out = {}

async def in_loop():
    return forks.fork_first(os.getpid())

out["in_a_loop"] = asyncio.run(in_loop())
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
out["beside_a_thread"] = forks.fork_first(os.getpid())
stop.set()
thread.join()
out["none_made"] = forks.proc is None
out["forked"] = forks.fork_first(os.getpid())
out["ready"] = asyncio.run(forks.wait_ready(30))
pid = forks.pid
out["our_child"] = pid == forks.proc.pid and int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
out["title"] = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()
out["stdin"] = os.readlink(f"/proc/{pid}/fd/0")
forks.close()
out["gone"] = not os.path.exists(f"/proc/{pid}")
print(json.dumps(out))
"""


def test_the_first_fork_server_is_forked_only_where_that_is_safe():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, stdin=subprocess.PIPE, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["in_a_loop"] is False and out["beside_a_thread"] is False and out["none_made"] is True
    assert out["forked"] is True and out["ready"] is True and out["our_child"] is True
    assert out["title"] == "agent-os: forkserver"
    assert out["stdin"] == "/dev/null"   # not the supervisor's (a terminal under `make run`)
    assert out["gone"] is True


def test_a_forked_process_exits_as_sys_exit_would_have_it(capsys):
    """The fork server forked from the supervisor, and each child it forks, must not unwind into
    the supervisor's code: what ends them is turned into the exit code the interpreter would give."""
    from agentos.forkserver import exit_code_of
    from agentos.service import EXIT_PARENT_GONE

    def parent_gone():
        raise SystemExit(EXIT_PARENT_GONE)

    def crash():
        raise ValueError("a role's bug")

    def refuse():
        raise SystemExit("agent-os: refused")

    assert exit_code_of(lambda: 0) == 0 and exit_code_of(lambda: None) == 0 and exit_code_of(lambda: 2) == 2
    assert exit_code_of(parent_gone) == EXIT_PARENT_GONE   # the supervisor reads it: not 1
    assert exit_code_of(crash) == 1 and exit_code_of(refuse) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a role's bug" in err   # not lost in a silent exit
    assert "agent-os: refused" in err
