"""Zeroing a 64 MB segment in 16 KB writes with a fdatasync per MB, into an empty file or one
whose blocks posix_fallocate took first: the zeroing thread's user/system CPU ms and wall ms, four
files each, twice. Run: python3 zero_probe.py (writes and deletes its files beside itself)."""
import os, time, resource
SIZE = 64 << 20; W = 16 << 10; CH = 1 << 20
def zero(path, falloc=False, wsize=W):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if falloc: os.posix_fallocate(fd, 0, SIZE)
    z = bytes(wsize); done = 0
    while done < SIZE:
        done += os.write(fd, z)
        if done % CH == 0: os.fdatasync(fd)
    os.close(fd)
def measure(label, **kw):
    res = []
    for i in range(4):
        p = f'/work/main/bench/results/2026-12-02-fallocate-spares-10k-ab/z{i}.seg'
        r0 = resource.getrusage(resource.RUSAGE_THREAD); t0 = time.monotonic()
        zero(p, **kw)
        t1 = time.monotonic(); r1 = resource.getrusage(resource.RUSAGE_THREAD)
        res.append(((r1.ru_utime - r0.ru_utime) * 1e3, (r1.ru_stime - r0.ru_stime) * 1e3, (t1 - t0) * 1e3))
    for i in range(4): os.unlink(f'/work/main/bench/results/2026-12-02-fallocate-spares-10k-ab/z{i}.seg')
    print(label, ' '.join(f'user {u:.0f} sys {s:.0f} wall {w:.0f}' for u, s, w in res))
for k in range(2):
    measure('plain 16K     ')
    measure('fallocate 16K ', falloc=True)
