"""fdatasync latency of 4 KB overwrites while 64 MB files are deleted (ext4 mounted with discard)."""
import os, sys, threading, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from storage.spares import zero_file

d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
mode = sys.argv[2]          # "unlink", "truncate-steps" or "none"
N = 6
for i in range(N):
    zero_file(d / f"big{i}", 64 << 20)
log = d / "log"
zero_file(log, 16 << 20)
fd = os.open(log, os.O_WRONLY)
lat = []; stamps = []; events = []
stop = threading.Event()

def deleter():
    time.sleep(0.5)
    for i in range(N):
        p = d / f"big{i}"
        t = time.perf_counter(); events.append(t)
        if mode == "unlink":
            p.unlink()
        elif mode == "truncate-steps":
            f = os.open(p, os.O_WRONLY)
            size = 64 << 20
            while size > 0:
                size = max(0, size - (4 << 20))
                os.ftruncate(f, size)
                time.sleep(0.002)
            os.close(f)
            p.unlink()
        print(f"  {mode} {i}: {1000*(time.perf_counter()-t):.1f} ms", flush=True)
        time.sleep(0.3)
    time.sleep(0.5)
    stop.set()

th = threading.Thread(target=deleter); th.start()
buf = os.urandom(4096); off = 0
while not stop.is_set():
    t = time.perf_counter()
    os.pwrite(fd, buf, off); os.fdatasync(fd)
    lat.append(1000 * (time.perf_counter() - t)); stamps.append((t, lat[-1]))
    off = (off + 4096) % (16 << 20)
th.join()
lat.sort()
q = lambda p: lat[min(len(lat)-1, int(len(lat)*p))]
print(f"{mode}: n={len(lat)} p50 {q(.5):.3f} p99 {q(.99):.3f} p99.9 {q(.999):.3f} max {lat[-1]:.3f} ms, over 5 ms: {sum(1 for x in lat if x > 5)}")
near = [ms for t, ms in stamps if any(0 <= t - e < 0.05 for e in events)]
far = [ms for t, ms in stamps if not any(-0.01 <= t - e < 0.1 for e in events)]
if near:
    print(f"  within 50 ms after a deletion: n={len(near)} max {max(near):.2f} ms, over 2 ms {sum(1 for x in near if x > 2)}; elsewhere: n={len(far)} over 2 ms {sum(1 for x in far if x > 2)} ({100*sum(1 for x in far if x > 2)/len(far):.2f}%)")
import json
if len(sys.argv) > 3:
    with open(sys.argv[3], "a") as f:
        f.write(json.dumps({"mode": mode, "n": len(lat), "p50_ms": q(.5), "p99_ms": q(.99), "p999_ms": q(.999),
                            "max_ms": lat[-1], "over_5ms": sum(1 for x in lat if x > 5),
                            "near_deletions_over_2ms": sum(1 for x in near if x > 2) if near else 0,
                            "elsewhere_over_2ms": sum(1 for x in far if x > 2) if near else None,
                            "deletions_s": [e - stamps[0][0] for e in events],
                            "timeline": [(round(t - stamps[0][0], 5), round(ms, 3)) for t, ms in stamps]}) + "\n")
for p in d.glob("big*"): p.unlink()
log.unlink()
