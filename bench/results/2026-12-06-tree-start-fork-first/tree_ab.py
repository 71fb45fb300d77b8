"""A tree's start and stop, N times, from the repository given: CPU of every process of the tree
(the children this script reaped), start wall time, and the tree's memory 2 s after start.
Usage: python tree_ab.py REPO LABEL N  -> one JSON line per tree on stdout."""
import json, os, sys, time, tempfile, pathlib, subprocess
repo, label, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, f"{repo}/tests"); sys.path.insert(0, repo)
from harness import Server
from agentos.status import proc_memory

def tree(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    pids = [int(p) for p in out.split()]
    return pids + [q for p in pids for q in tree(p)]

for i in range(n):
    d = pathlib.Path(tempfile.mkdtemp())
    c0 = os.times(); t0 = time.time()
    s = Server(d).start()
    started = time.time() - t0
    time.sleep(2)
    pids = [s.proc.pid] + tree(s.proc.pid)
    mem = {}
    for p in pids:
        for k, v in proc_memory(p).items():
            mem[k] = mem.get(k, 0) + v
    s.stop()
    c1 = os.times()
    cpu = c1.children_user + c1.children_system - c0.children_user - c0.children_system
    print(json.dumps({"label": label, "run": i, "start_wall_s": round(started, 3), "tree_cpu_s": round(cpu, 3),
                      "processes": len(pids), "pss_mib": round(mem["pss_kib"] / 1024, 1),
                      "private_dirty_mib": round(mem["private_dirty_kib"] / 1024, 1)}), flush=True)
