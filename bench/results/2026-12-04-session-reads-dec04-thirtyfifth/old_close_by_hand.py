"""By hand, not part of bench.session_reads: closes on the code before bounded closes (81e17e5), on
the 20,000-session log of bench.session_reads (50 turns, 1000 alive at a time), loaded by that
code's Store. Usage: python old_close_by_hand.py SCRATCH_DIR 20000 20 CHECKOUT_OF_81e17e5"""
import sys, shutil, random, time, subprocess
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from bench.session_reads import load, session_id
d = Path(sys.argv[1]); work = d / "work"; n = int(sys.argv[2])
shutil.rmtree(work, ignore_errors=True); shutil.copytree(d / "with", work)
store, secs = load(work, True)
ends = {0: store.progress["messages"][0]}
rng = random.Random(11)
ok, failed, times = 0, 0, []
for i in range(int(sys.argv[3])):
    sid = session_id(rng.randrange(n))
    t = time.perf_counter()
    try:
        with store.loading:
            store.apply_close(sid, ends, 0, 10**12 + i); ok += 1; times.append((time.perf_counter() - t) * 1000)
    except Exception as e:
        failed += 1; print("failed:", type(e).__name__, str(e)[:70])
import statistics
print("commit", subprocess.run(["git", "-C", sys.argv[4], "log", "--oneline", "-1"], capture_output=True, text=True).stdout.strip(),
      "ok", ok, "failed", failed, "p50 ms", round(statistics.median(times), 1) if times else None)
