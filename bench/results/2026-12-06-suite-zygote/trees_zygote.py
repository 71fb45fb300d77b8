"""N trees started and stopped by the test harness, with TEST_ZYGOTE as set; plus a worker for each.
Run under /usr/bin/time: the CPU of everything (the zygote and its launches are reaped into ours)."""
import sys, tempfile, pathlib, shutil
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from harness import Server, Worker
import zygote
n = int(sys.argv[1])
for i in range(n):
    d = pathlib.Path(tempfile.mkdtemp())
    s = Server(d).start()
    w = Worker(s).wait_registered()
    s.cli("status")
    w.stop(); s.stop()
    shutil.rmtree(d, ignore_errors=True)
zygote.close_shared()
