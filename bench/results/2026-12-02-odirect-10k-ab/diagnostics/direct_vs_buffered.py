"""Buffered write + fdatasync vs O_DIRECT|O_DSYNC into a pre-zeroed file, alternating."""
import mmap, os, statistics, sys, time

# usage: python direct_vs_buffered.py FILE BYTES_PER_WRITE COUNT [z]  (z: zero another file meanwhile)
path = sys.argv[1]
size = int(sys.argv[2])          # bytes per batch
n = int(sys.argv[3])
SEG = 64 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
zero = bytes(1 << 20)
for off in range(0, SEG, len(zero)):
    os.pwrite(fd, zero, off)
os.fsync(fd)
os.close(fd)
buf = mmap.mmap(-1, size + 8192)
buf.write(os.urandom(size + 8192))
data = bytes(buf[:size])

def buffered():
    fd = os.open(path, os.O_RDWR)
    lat = []
    off = 0
    for _ in range(n):
        t = time.perf_counter()
        os.pwrite(fd, data, off)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
        off = (off + size) % (SEG - size)
    os.close(fd)
    return lat

def direct(sync_flag):
    fd = os.open(path, os.O_RDWR | os.O_DIRECT | sync_flag)
    aligned = (size + 4095) // 4096 * 4096
    mv = memoryview(buf)[:aligned]
    lat = []
    off = 0
    for _ in range(n):
        t = time.perf_counter()
        os.pwritev(fd, [mv], off)
        if not sync_flag:
            os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
        off = (off + aligned) % (SEG - aligned)
        off -= off % 4096
    os.close(fd)
    return lat

import threading
stop = threading.Event()
def zeroer():
    while not stop.is_set():
        sys.path.insert(0, "/work/main")
        from storage.segments import zero_file
        from pathlib import Path
        zero_file(Path(path + ".z"), SEG)
if len(sys.argv) > 4:
    threading.Thread(target=zeroer, daemon=True).start()
res = {"buffered+fdatasync": [], "direct+dsync": [], "direct+fdatasync": []}
for r in range(4):
    res["buffered+fdatasync"] += buffered()
    res["direct+dsync"] += direct(os.O_DSYNC)
    res["direct+fdatasync"] += direct(0)
for k, v in res.items():
    v.sort()
    print(f"{k:22s} size {size:>7} p50 {v[len(v)//2]*1e3:.3f} ms  p99 {v[int(len(v)*0.99)]*1e3:.3f}  mean {statistics.mean(v)*1e3:.3f}")
stop.set(); time.sleep(0.5); os.unlink(path)
if os.path.exists(path + ".z"): os.unlink(path + ".z")
