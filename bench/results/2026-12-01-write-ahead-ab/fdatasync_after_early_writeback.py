import ctypes
import os
import statistics
import time
libc = ctypes.CDLL(None, use_errno=True)
sfr = libc.sync_file_range
sfr.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
WRITE = 2
path = "/tmp/aio/sfr.dat"
size = 256 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
z = bytes(16384)
for i in range(size // 16384):
    os.write(fd, z)
    if i % 64 == 63: os.fdatasync(fd)
os.fdatasync(fd)
rec = os.urandom(21 * 1024)
def batch(off, mode, gap):
    t_sync = 0.0
    if mode == "end":
        time.sleep(gap * 10)
        os.pwritev(fd, [rec] * 10, off)
    else:
        for i in range(10):
            os.pwrite(fd, rec, off + i * len(rec))
            if mode == "kick":
                sfr(fd, off + i * len(rec), len(rec), WRITE)
            time.sleep(gap)
    t = time.perf_counter(); os.fdatasync(fd); t_sync = time.perf_counter() - t
    return t_sync, off + 10 * len(rec)
off = 0
res = {"end": [], "each": [], "kick": []}
for r in range(300):
    for mode in ("end", "each", "kick"):
        t, off = batch(off, mode, 0.00007)
        res[mode].append(t * 1000)
        if off > size - (1 << 20): off = 0
for mode, v in res.items():
    v.sort(); print(f"{mode:5s} fdatasync p50 {v[len(v)//2]:.3f} ms  p90 {v[int(len(v)*.9)]:.3f}  mean {statistics.mean(v):.3f}")
os.close(fd); os.unlink(path)
