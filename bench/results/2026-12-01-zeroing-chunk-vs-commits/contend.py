import os, sys, time, statistics, subprocess
D = "/tmp/dbg/io"
SIZE = 64 << 20
def zeroed(p):
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    z = b"\0" * (16 << 10)
    for off in range(0, SIZE, len(z)):
        os.pwrite(fd, z, off)
    os.fsync(fd); os.close(fd)
def loop(n=600, nbytes=225280):
    p = f"{D}/seg-c"; zeroed(p)
    fd = os.open(p, os.O_RDWR); data = os.urandom(nbytes); lat = []; off = 0
    for i in range(n):
        t = time.perf_counter(); os.pwrite(fd, data, off); os.fdatasync(fd); lat.append((time.perf_counter() - t) * 1000)
        off += nbytes
        if off + nbytes > SIZE: off = 0
    os.close(fd); os.unlink(p); lat.sort()
    return f"p50 {statistics.median(lat):.3f} p90 {lat[int(len(lat)*.9)]:.3f} mean {statistics.mean(lat):.3f}"
mode = sys.argv[1]
hogs = []
if mode == "cpu":
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
elif mode.startswith("zero"):
    hogs = [subprocess.Popen([sys.executable, "-c", f"""
import os, time
CHUNK = {int(mode[4:] or 1024)} * 1024
t0 = time.time(); n = 0
z = bytes(16384)
while True:
    fd = os.open('{D}/zero-hog', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    while done < (64 << 20):
        done += os.write(fd, z)
        if done % CHUNK == 0: os.fdatasync(fd)
    os.close(fd); n += 1
    open('{D}/zero-rate', 'w').write(str(n * 64 / (time.time() - t0)))
"""])]
elif mode == "cpu1":
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
time.sleep(0.3)
try:
    r = loop()
    rate = open(f'{D}/zero-rate').read() if os.path.exists(f'{D}/zero-rate') else '-'
    print(mode, r, 'zero MB/s', rate[:6], flush=True)
finally:
    for h in hogs: h.kill()
    try: os.unlink(f"{D}/zero-hog"); os.unlink(f"{D}/zero-rate")
    except OSError: pass
