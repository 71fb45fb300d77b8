"""End-to-end: twenty seconds of `agent-os bench chaos` — turns, checkpoints, flows (some fanned
out, some woken by a message on either of two channels), forks of both and a schedule's run
every second (every kind of acknowledged work is counted above zero) while every role of the
tree is killed with SIGKILL in turn, or stopped for seconds, on a log that rotates and compacts
all the while — and the load generator's own accounting says nothing acknowledged was lost and
no stream hung. (The ten-minute run is a benchmark.)"""
import json
import re
import signal
import subprocess
import sys

from bench.server_proc import pid_alive
from harness import REPO

ROLES = {"broker", "gateway/0", "actor/0", "actor/1", "scheduler", "writer/log/0", "writer/store", "mock-llm",
         "forkserver"}   # its death only means the supervisor starts a new one


def test_twenty_seconds_of_sigkills_lose_nothing_acknowledged(tmp_path):
    cmd = [sys.executable, "-m", "agentos.cli", "bench", "chaos", "--seconds", "20", "--kill-every", "1.4",
           "--warmup", "4", "--cooldown", "4", "--deadline", "45", "--seed", "3",
           # a quarter of the benchmark's clients: every kind of work, on a CPU the other tests share
           "--turn-clients", "4", "--checkpoint-clients", "2", "--flow-clients", "2", "--close-clients", "1",
           "--busy-log",   # 1 MiB segments, a compaction pass every 2 s: kills land in rotations and rewrites
           "--stall-every", "5",   # and a role stopped for 2-6 s now and then: slow, not dead
           "--results-root", str(tmp_path / "results")]
    printed = tmp_path / "printed.txt"   # a file, not a pipe: read also when pytest's timeout ends the test
    with printed.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:   # SIGTERM: the benchmark stops its server tree on the way out
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        output = printed.read_text()
        print(output[-6000:])   # shown if the test fails: its kills, and which of its waits was long
    (folder,) = (tmp_path / "results").iterdir()
    row = json.loads((folder / "rows.jsonl").read_text())
    kills = [json.loads(line) for line in (folder / "kills.jsonl").read_text().splitlines()]
    assert proc.returncode == 0, output[-4000:]
    assert row["lost"] == 0 and row["hung"] == 0
    # the JSON-lines copy of the events, on in this run: whole, though writer/store was killed
    jsonl = row["jsonl"]
    assert jsonl["lines"] > 0 and jsonl["missing"] == jsonl["extra"] == jsonl["bad_lines"] == 0, jsonl
    assert len(kills) >= len(ROLES) and {k["role"] for k in kills} == ROLES   # at least one whole round
    assert row["stalls"]   # a role was stopped for seconds, and continued
    for role, n in row["kills_by_role"].items():
        assert row["restarts_by_role"][role] >= n
    acked = row["acknowledged"]
    assert min(n for what, n in acked.items() if what != "ticketed_runs") > 0 and row["turn_outcomes"]["completed"] > 0
    # (a starved run may have had one chosen run: a messenger's; any two had a ticketed one)
    assert acked["ticketed_runs"] > 0 or acked["chosen_runs"] < 2, acked
    # turns cut short mid-way through their tool calls (cancelled, superseded, their actor killed)
    # left no call unanswered: the provider refused no session's history
    assert "bad_request" not in row["turn_failures"], row["turn_failures"]
    assert row["flow_results"]["unfinished"] == 0
    assert (folder / "summary.md").exists() and (folder / "chaos.png").exists()
    server_log = (folder / "server.log").read_text()
    assert "restarting" in server_log   # the tree's own account is kept
    # the kills met compaction passes that did something: a log's (once a segment was sealed) or the
    # payload file's (on a slow machine the log may not fill its first segment in 20 s)
    assert re.search(r"compaction: (dropped|payload segment \d+ rewritten)", server_log)
    assert (folder / "worker-0.log").exists()
    # and its count of errors is the log's: ERROR and CRITICAL records, not the kills' WARNINGs
    errors = [line for line in server_log.splitlines() if re.match(r"\S+ \S+ \S+ (ERROR|CRITICAL) ", line)]
    assert row["logged_errors"]["server.log"] == len(errors) and "worker-0.log" in row["logged_errors"]
    assert f"server.log {len(errors)}" in (folder / "summary.md").read_text()
    pids = [k["pid"] for k in kills + row["stalls"]] + [m["pid"] for m in row["memory_kib"].values()]
    assert not [p for p in pids if pid_alive(p)]   # the benchmark left nothing running



def test_the_killer_leaves_a_role_whose_process_is_dead_and_not_yet_reaped():
    """A slow supervisor's table still names a killed role's old process until it reaps it: a
    SIGKILL to that zombie succeeds and kills nothing. Counted as a kill, the role then had fewer
    restarts than kills (seen at 0.75 of a CPU). A fake server; the zombie is a real one."""
    import asyncio
    import random
    import time
    import types

    from bench.chaos import killer

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while pid_alive(zombie.pid):   # (a zombie is not alive)
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        server = types.SimpleNamespace(pids=lambda: {"supervisor": 1, "actor/0": zombie.pid}, seen_pids=set())
        kills: list[dict] = []

        async def go():
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            await killer(server, 0.02, random.Random(1), stop, kills, time.monotonic(), [])

        asyncio.run(go())
        assert kills == []
    finally:
        zombie.wait()
