"""An S3 tree (as make_s3_server makes it): CPU by process at ready + 2 s, and after 30 checkpoint PUTs."""
import sys, time, tempfile, pathlib, subprocess, json, urllib.request
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from harness import Server
from bench.s3_local import CREDENTIALS, S3Server
from bench.server_proc import cpu_seconds
import zygote
def tree(pid):
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        p, args = line.strip().split(" ", 1)
        rows.append((int(p), args)); rows += tree(int(p))
    return rows
s3 = S3Server()
try:
    label, n = sys.argv[1], int(sys.argv[2])
    for i in range(n):
        d = pathlib.Path(tempfile.mkdtemp())
        s = Server(d / "a", s3.storage_config(s3.new_bucket(), "s3"), env=CREDENTIALS).start()
        time.sleep(2)
        rows = [(s.proc.pid, "supervisor")] + tree(s.proc.pid)
        print(json.dumps({"label": label, "tree": i, "moment": "ready+2s", "cpu_s": {n.replace("agent-os: ", "")[:20]: round(cpu_seconds(p), 2) for p, n in rows}}))
        for k in range(30):
            urllib.request.urlopen(urllib.request.Request(f"{s.url}/v1/sessions/s{k}/checkpoints/k", data=b"x" * 3000, method="PUT")).read()
        time.sleep(2)
        print(json.dumps({"label": label, "tree": i, "moment": "after 30 PUTs", "cpu_s": {n.replace("agent-os: ", "")[:20]: round(cpu_seconds(p), 2) for p, n in rows}}))
        s.stop()
finally:
    s3.stop(); zygote.close_shared()
