"""Scratch: a persist tree at c=1000; run_delay (schedstat) of each process's threads over 10 s."""
import glob, subprocess, sys, time, tempfile, json
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench.mock_proc import MockModel
from bench.server_proc import ServerProcess
from bench.turns import bench_config
from bench import fsync_window

def sched(pid):
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            cpu, delay, slices = map(int, open(t).read().split())
        except OSError:
            continue
        comm = open(t.replace("schedstat", "comm")).read().strip()
        out[t.split("/")[4]] = (comm, cpu, delay, slices)
    return out

profile = sys.argv[1] if len(sys.argv) > 1 else "persist"
nice = int(sys.argv[2]) if len(sys.argv) > 2 else 0
import os
work = Path(tempfile.mkdtemp(prefix="probe-", dir="/work/notes"))
with MockModel(2000, 200, 8) as mock:
    server = ServerProcess(work / profile, bench_config(profile, mock.url, 1000, 0)).start()
    try:
        pids = server.pids()
        if nice:
            for name, pid in pids.items():
                if name.startswith("writer/log") or name.startswith(tuple(sys.argv[3:])):
                    for t in os.listdir(f"/proc/{pid}/task"):
                        if nice > 0:
                            os.sched_setscheduler(int(t), os.SCHED_FIFO, os.sched_param(nice))
                        else:
                            os.setpriority(os.PRIO_PROCESS, int(t), nice)
        pids["mock"] = mock.pid
        lg = subprocess.Popen([sys.executable, "-m", "bench.loadgen", "--url", server.url, "--concurrency", "1000",
                               "--duration", "18", "--warmup", "3", "--session-prefix", "p", "--input", "Say something.",
                               "--json", str(work / "lg.json")], cwd="/work/main", stdout=subprocess.DEVNULL)
        pids["loadgen"] = lg.pid
        time.sleep(6)
        before = fsync_window.snapshot(server.url)
        s0 = {n: sched(p) for n, p in pids.items()}
        time.sleep(10)
        s1 = {n: sched(p) for n, p in pids.items()}
        after = fsync_window.snapshot(server.url)
        print(fsync_window.delta(before, after))
        for n in pids:
            for tid, (comm, cpu, delay, sl) in s1[n].items():
                if tid in s0[n]:
                    _, c0, d0, l0 = s0[n][tid]
                    if n.startswith("writer/log") and comm.startswith("agent-os"):
                        print(f"{n:14} {comm:16} cpu {(cpu-c0)/1e8:6.1f}%  run_delay {(delay-d0)/1e8:6.1f}%  slices {sl-l0:6d}  delay/slice {((delay-d0)/max(1,sl-l0))/1e6:.2f} ms")
        lg.wait()
        print("nice", nice, "turns/s", json.loads((work / "lg.json").read_text())["turns_per_sec"])
    finally:
        server.stop()
import shutil; shutil.rmtree(work)
