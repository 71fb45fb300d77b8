import mmap, os, time, statistics
D = "/tmp/dbg/io"
SIZE = 64 << 20
def zeroed(name):
    p = f"{D}/{name}"
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    z = b"\0" * (16 << 10)
    for off in range(0, SIZE, len(z)):
        os.pwrite(fd, z, off)
    os.fsync(fd); os.close(fd)
    return p
def run(mode, nbytes, n=400):
    p = zeroed(f"seg-{mode}")
    flags = os.O_RDWR
    if mode in ("direct", "direct_dsync"): flags |= os.O_DIRECT
    if mode in ("direct_dsync", "dsync"): flags |= os.O_DSYNC
    fd = os.open(p, flags)
    pad = (nbytes + 4095) // 4096 * 4096
    buf = mmap.mmap(-1, pad)
    buf.write(os.urandom(nbytes))
    data = os.urandom(nbytes)
    lat = []
    off = 0
    for i in range(n):
        t = time.perf_counter()
        if mode == "buffered":
            os.pwrite(fd, data, off); os.fdatasync(fd); step = nbytes
        elif mode == "rwf_dsync":
            os.pwritev(fd, [data], off, os.RWF_DSYNC); step = nbytes
        elif mode == "dsync":
            os.pwrite(fd, data, off); step = nbytes
        elif mode == "direct":
            os.pwritev(fd, [buf], off); os.fdatasync(fd); step = pad
        elif mode == "direct_dsync":
            os.pwritev(fd, [buf], off); step = pad
        lat.append((time.perf_counter() - t) * 1000)
        off += step
        if off + pad > SIZE: off = 0
    os.close(fd); os.unlink(p)
    lat.sort()
    return statistics.median(lat), lat[int(len(lat) * .99)]
for rnd in range(2):
    for nbytes in (4096, 22528, 225280):
        for mode in ("buffered", "rwf_dsync", "direct", "direct_dsync"):
            p50, p99 = run(mode, nbytes)
            print(f"r{rnd} {nbytes:>7} {mode:>13} p50 {p50:.3f} p99 {p99:.3f}", flush=True)
