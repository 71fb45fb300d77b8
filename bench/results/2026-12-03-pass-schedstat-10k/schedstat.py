"""Every STEP s, per thread of the given pids: ms on CPU and ms waiting on a run queue (schedstat)."""
import os, sys, time
pids = sys.argv[1:-1]; secs = float(sys.argv[-1]); step = float(os.environ.get("STEP", "0.2"))
def snap():
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                run, wait, _ = map(int, open(f"/proc/{pid}/task/{tid}/schedstat").read().split())
                comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip().replace("agent-os: ", "")
                out[(comm, tid)] = (run, wait)
            except OSError:
                pass
    return out
prev = snap(); end = time.time() + secs
while time.time() < end:
    time.sleep(step)
    cur = snap(); now = time.time()
    rows = []
    for k, (r, w) in cur.items():
        pr, pw = prev.get(k, (0, 0))
        dr, dw = (r - pr) / 1e6, (w - pw) / 1e6
        if dr > 5 or dw > 2:
            rows.append((dr, f"{k[0]}/{k[1]}:{dr:.0f}+{dw:.0f}w"))
    if rows:
        print(time.strftime('%H:%M:%S', time.gmtime(now)) + f".{int(now % 1 * 10)}", " ".join(r for _, r in sorted(rows, reverse=True)[:7]))
    prev = cur
