import subprocess, sys
from bench.peer_pgredis import ReferenceStack
code = '''
import time, sys, threading
from dbos import DBOS
DBOS(config={"name": "tsync", "system_database_url": sys.argv[1], "log_level": "WARNING", "sys_db_pool_size": 40})
@DBOS.step()
def s(i): return i
@DBOS.workflow()
def wf(n):
    for i in range(n): s(i)
    return n
DBOS.launch()
clients = int(sys.argv[2]); end = time.time() + 6; start = time.time() + 2
count = [0]
def client():
    while time.time() < end:
        h = DBOS.start_workflow(wf, 10); h.get_result()
        if time.time() >= start: count[0] += 10
ts = [threading.Thread(target=client) for _ in range(clients)]
t0 = time.process_time()
[t.start() for t in ts]; [t.join() for t in ts]
print("sync api steps/s", count[0] / 4, "cpu", (time.process_time() - t0) / 6)
DBOS.destroy()
'''
with ReferenceStack(None, redis=False) as stack:
    dsn = stack.database("dbos")
    for c in sys.argv[1:]:
        out = subprocess.run([sys.executable, "-c", code, dsn, c], capture_output=True, text=True, timeout=120)
        print(c, out.stdout, out.stderr[-800:])
