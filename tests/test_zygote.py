"""The test zygote (tests/zygote.py): what it launches sees what a new interpreter started with
the same command line would, and the harness hears how it ended as from a subprocess."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.server_proc import REPO, pid_alive, wait_until
from harness import Server, scrape, turn
from zygote import SERVE, Zygote, ZygoteGone, shared

TESTS = Path(__file__).parent


@pytest.fixture
def zygote():
    made = Zygote()
    yield made
    made.close()


def by_subprocess(tmp_path: Path, env: dict, safe_path: bool, code: int) -> tuple[int, dict, str]:
    out, err = tmp_path / "sub.out", tmp_path / "sub.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, *(["-P"] if safe_path else []), "-m", "zygote_probe", str(code)],
                                cwd=TESTS, env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                start_new_session=True)
        returncode = proc.wait(30)
    return returncode, json.loads(out.read_text()), err.read_text()


def by_zygote(zygote: Zygote, tmp_path: Path, env: dict, safe_path: bool, code: int) -> tuple[int, dict, str]:
    out, err = tmp_path / "zyg.out", tmp_path / "zyg.err"
    proc = zygote.launch("zygote_probe", [str(code)], cwd=TESTS, env=env, log=out, stderr=err, safe_path=safe_path)
    return proc.wait(30), json.loads(out.read_text()), err.read_text()


@pytest.mark.parametrize("safe_path", [False, True], ids=["python -m", "python -P -m"])
def test_a_launch_sees_what_a_new_interpreter_with_its_command_line_sees(zygote, tmp_path, safe_path):
    # with -P the working directory is not on the path: PYTHONPATH names it
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{TESTS}", ZYGOTE_PROBE=f"probe-{safe_path}")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    expected = by_subprocess(tmp_path, env, safe_path, 3)
    launched = by_zygote(zygote, tmp_path, env, safe_path, 3)
    assert launched == expected
    code, seen, err = launched
    assert code == 3 and err == "to stderr\n" and seen["probe_env"] == f"probe-{safe_path}"
    assert seen["title"] == "zygote-probe: a title of some length"
    assert seen["session_leader"] and seen["stdin"] == "/dev/null" and seen["name"] == "__main__"
    # imported as the process's environment says, not the zygote's
    assert not seen["prometheus_imported"] and seen["our_modules"] == [] and seen["threads"] == 1


def test_exits_and_signals_read_as_a_subprocess_reports_them(zygote, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sleeper = zygote.launch("zygote_probe", ["sleep"], cwd=TESTS, env=env, log=tmp_path / "s.out", safe_path=False)
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.2)
    assert sleeper.poll() is None and pid_alive(sleeper.pid)
    sleeper.send_signal(signal.SIGKILL)
    assert sleeper.wait(10) == -signal.SIGKILL and sleeper.returncode == -signal.SIGKILL
    sleeper.kill()   # gone already: nothing happens, as with a subprocess

    broken = zygote.launch("no_such_module_here", [], cwd=TESTS, env=env, log=tmp_path / "b.out")
    assert broken.wait(10) == 1
    assert "No module named no_such_module_here" in (tmp_path / "b.out").read_text()


def test_a_pid_the_kernel_gives_again_is_a_new_process_to_the_harness(zygote):
    """The zygote reports an exit before the kernel can hand its pid to a later launch: the later
    launch is running, whatever the earlier holder of its pid ended with."""
    zygote._heard({"pid": 4242})
    first = zygote._answers.get_nowait()
    zygote._heard({"exited": 4242, "code": 3})
    zygote._heard({"pid": 4242})
    second = zygote._answers.get_nowait()
    assert first.poll() == 3 and second.poll() is None and second is not first
    zygote._heard({"exited": 4242, "code": -9})
    assert second.wait(1) == -9 and first.returncode == 3


def test_closing_the_zygote_ends_it_and_leaves_what_it_launched_running(tmp_path):
    zygote = Zygote()
    sleeper = zygote.launch("zygote_probe", ["sleep"], cwd=TESTS, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            log=tmp_path / "s.out", safe_path=False)
    try:
        zygote.close()
        assert zygote.proc.returncode == 0
        assert pid_alive(sleeper.pid)
    finally:
        os.kill(sleeper.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(sleeper.pid), 10, "the orphan to be reaped")


def test_a_wait_on_a_launch_whose_zygote_died_says_so_at_once(tmp_path):
    """Only the zygote reaps what it launched: once it is gone, a wait cannot end with a code, and
    ran to its timeout (forever without one). It now says why."""
    zygote = Zygote()
    sleeper = zygote.launch("zygote_probe", ["sleep"], cwd=TESTS, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            log=tmp_path / "s.out", safe_path=False)
    try:
        zygote.proc.kill()
        with pytest.raises(ZygoteGone, match=f"how pid {sleeper.pid} .*zygote_probe sleep.* cannot be known"):
            sleeper.wait(60)
        assert sleeper.poll() is None and pid_alive(sleeper.pid)   # an orphan, still running
    finally:
        os.kill(sleeper.pid, signal.SIGKILL)
        zygote.close()
    wait_until(lambda: not pid_alive(sleeper.pid), 10, "the orphan to be reaped")


def test_a_tree_the_serve_zygote_launched_counts_in_its_own_run_directory(tmp_path):
    """The serve zygote imported the server's modules, and made their metric values, with
    prometheus-client in multiprocess mode and a directory of its own. The tree it launches
    counts in its run directory alone (a gauge made at import included), and its supervisor's
    start is its launch, not the zygote's imports."""
    zygote = shared(SERVE)
    # it answers a launch once it has imported what it preloads
    probe = zygote.launch("zygote_probe", ["0"], cwd=TESTS, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          log=tmp_path / "probe.out", safe_path=False)
    assert probe.wait(30) == 0
    launched_at = time.time()
    server = Server(tmp_path, {"kernel": {"max_in_flight_turns": 37}}).start()
    try:
        assert turn(server.url, "s1", "hello").text
        assert server.table()["supervisor"]["started_at"] >= launched_at
        def turns_counted():   # hot paths flush their counts about once a second
            return sum(v for k, v in scrape(server.url).items() if k.startswith("agentos_turns_total{"))
        wait_until(lambda: turns_counted() == 1, 10, "the turn to be counted")
        values = scrape(server.url)
        assert values["agentos_admission_limit"] == 37 and values["agentos_in_flight_turns"] == 0
        tree = {server.proc.pid, *server.pids().values()}
        written = {int(f.stem.rsplit("_", 1)[1]) for f in (server.rundir / "metrics").glob("*_*.db")}
        assert written and written <= tree
        assert {f.name for f in Path(zygote.metrics_dir).iterdir()} == {
            f.name for f in Path(zygote.metrics_dir).glob(f"*_{zygote.proc.pid}.db")}
    finally:
        server.stop()


def test_the_serve_zygote_removes_its_metrics_directory_when_its_harness_is_gone():
    zygote = Zygote(SERVE)
    try:
        wait_until(lambda: any(Path(zygote.metrics_dir).iterdir()), 30, "the zygote to import the server")
        zygote.sock.shutdown(socket.SHUT_RDWR)   # its EOF, as when the test process dies without `close()`
        assert zygote.proc.wait(10) == 0
        assert not Path(zygote.metrics_dir).exists()
    finally:
        zygote.close()
