import zmq, time, os, sys
from zmq.backend import Socket as B
N=20000; SIZE=int(sys.argv[1]); opt=sys.argv[2] if len(sys.argv)>2 else ""
addr="ipc:///tmp/zb/s.sock"
def setopts(s):
    if "batch" in opt:
        for o in (101,102):
            try: s.setsockopt(o, 1<<20)
            except Exception as e: print("opt", o, e)
    if "buf" in opt:
        s.setsockopt(zmq.SNDBUF, 4<<20); s.setsockopt(zmq.RCVBUF, 4<<20)
pid=os.fork()
ctx=zmq.Context()
if pid==0:
    s=ctx.socket(zmq.PULL); setopts(s); s.bind(addr)
    t=time.perf_counter(); c0=time.process_time()
    for i in range(N):
        b=B.recv(s,0,True,False)
    print(f"recv: {N/(time.perf_counter()-t):.0f} msg/s, cpu/msg {(time.process_time()-c0)/N*1e6:.1f} us")
    os._exit(0)
s=ctx.socket(zmq.PUSH); setopts(s); s.connect(addr); s.setsockopt(zmq.SNDHWM, 100)
data=b"x"*SIZE
time.sleep(0.3)
t=time.perf_counter(); c0=time.process_time()
for i in range(N):
    B.send(s, data, 0, True, False)
os.waitpid(pid,0)
print(f"send: cpu/msg {(time.process_time()-c0)/N*1e6:.1f} us")
