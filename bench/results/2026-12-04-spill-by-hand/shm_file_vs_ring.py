import os, time
d="/dev/shm/zbtest"; os.makedirs(d, exist_ok=True)
data=b"x"*163900; N=20000
t=time.perf_counter(); c=time.process_time()
for i in range(N):
    p=f"{d}/{i:x}"
    fd=os.open(p, os.O_WRONLY|os.O_CREAT|os.O_EXCL, 0o600); os.write(fd, data); os.close(fd)
    fd=os.open(p, os.O_RDONLY|os.O_NOFOLLOW); b=os.read(fd, 1<<20); os.close(fd); os.unlink(p)
print("file write+read+unlink us", (time.perf_counter()-t)/N*1e6, (time.process_time()-c)/N*1e6)
import mmap
size=64<<20
fd=os.open(f"{d}/ring", os.O_RDWR|os.O_CREAT, 0o600); os.ftruncate(fd, size)
m=mmap.mmap(fd, size)
t=time.perf_counter()
off=0
for i in range(N):
    if off+len(data)>size: off=0
    m[off:off+len(data)]=data
    b=m[off:off+len(data)]
    off+=len(data)
print("ring us", (time.perf_counter()-t)/N*1e6)
