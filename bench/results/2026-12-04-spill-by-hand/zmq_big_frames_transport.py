import zmq, time, os, sys
from zmq.backend import Socket as B
N=20000; SIZE=int(sys.argv[1]); tr=sys.argv[2]
addr="ipc:///tmp/zb/s.sock" if tr=="ipc" else "tcp://127.0.0.1:5599"
pid=os.fork()
ctx=zmq.Context()
if pid==0:
    s=ctx.socket(zmq.PULL); s.bind(addr)
    t=time.perf_counter(); c0=time.process_time()
    for i in range(N):
        b=B.recv(s,0,sys.argv[3]=="copy",False)
    print(f"recv {tr}: {N/(time.perf_counter()-t):.0f} msg/s, cpu/msg {(time.process_time()-c0)/N*1e6:.1f} us")
    os._exit(0)
s=ctx.socket(zmq.PUSH); s.connect(addr); s.setsockopt(zmq.SNDHWM, 100)
data=b"x"*SIZE
time.sleep(0.3)
t=time.perf_counter(); c0=time.process_time()
for i in range(N):
    B.send(s, data, 0, True, False)
os.waitpid(pid,0)
print(f"send: cpu/msg {(time.process_time()-c0)/N*1e6:.1f} us")
