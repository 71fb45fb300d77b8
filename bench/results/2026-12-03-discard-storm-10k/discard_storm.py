"""For SECS seconds: allocate a 64 MB file (posix_fallocate) and free it through storage.freeing, over and over."""
import os, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
from storage import freeing
d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); secs = float(sys.argv[2])
t = time.time(); n = 0
while time.time() - t < secs:
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.posix_fallocate(fd, 0, 64 << 20); os.fsync(fd); os.close(fd)
    freeing.release(p); n += 1
print(f"freed {n} files of 64 MB in {time.time()-t:.2f} s", flush=True)
