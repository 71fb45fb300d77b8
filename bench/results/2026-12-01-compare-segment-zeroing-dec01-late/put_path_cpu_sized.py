import asyncio, logging, os, sys, time, cProfile, pstats, resource
# ROOT: the tree whose code runs (another checkout, for a side by side); by default this one
sys.path.insert(0, os.environ.get("ROOT") or "/work/main")
import uvloop
from agentos.config import from_dict
from gateway.app import Gateway
from gateway.fast_path import FrontServer, FrontConnection
from storage.log_writer import LogWriter

DUR = sys.argv[1] if len(sys.argv) > 1 else "none"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
PROFILE = len(sys.argv) > 3
tmp = f"/tmp/put-path-cpu/data-{os.getpid()}"
cfg = from_dict({"storage": {"dir": tmp, "durability": DUR, **({"segment_bytes": int(os.environ["SEG"])} if os.environ.get("SEG") else {})}})
log = logging.getLogger("micro")
SIZE = int(os.environ.get("SIZE", "0")); payloads = [os.urandom(SIZE) for j in range(20)] if SIZE else [os.urandom(2048 + 2048 * j) for j in range(20)]

class Transport:
    def __init__(self, on_write): self.on_write = on_write; self.closing = False
    def write(self, data): self.on_write(bytes(data))
    def writelines(self, parts): self.on_write(b"".join(parts))
    def is_closing(self): return self.closing
    def pause_reading(self): pass
    def resume_reading(self): pass
    def close(self): self.closing = True
    def get_extra_info(self, *a, **k): return None

async def main():
    endpoint = f"ipc://{tmp}/nobus.sock"
    os.makedirs(tmp, exist_ok=True)
    own = LogWriter(cfg, cfg.gateway_log_index, endpoint, log, embedded=True)
    await own.start()
    gw = Gateway(cfg, endpoint, 0, log, own)
    front = FrontServer(gw, None)
    done = asyncio.Event()
    count = [0]
    def client(i):
        conn = FrontConnection(front)
        state = {"j": 0, "a": 0}
        def send():
            j = state["j"]; p = payloads[j]
            head = (f"PUT /v1/sessions/w{i}-a{state['a']}/checkpoints/{j} HTTP/1.1\r\nHost: x\r\n"
                    f"Content-Type: application/octet-stream\r\nContent-Length: {len(p)}\r\n\r\n").encode()
            conn.data_received(head + p)
        def on_write(data):
            assert data.startswith(b"HTTP/1.1 200"), data[:200]
            count[0] += 1
            if count[0] >= N: done.set(); return
            state["j"] += 1
            if state["j"] == 20: state["j"] = 0; state["a"] += 1
            asyncio.get_running_loop().call_soon(send)
        conn.connection_made(Transport(on_write))
        send()
    t0 = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF)
    prof = cProfile.Profile() if PROFILE else None
    if prof: prof.enable()
    for i in range(10): client(i)
    await done.wait()
    if prof: prof.disable()
    el = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{DUR}: {N} PUTs in {el:.2f}s = {N/el:.0f}/s; CPU {1e6*cpu/N:.1f} us/PUT (user {1e6*(r1.ru_utime-r0.ru_utime)/N:.1f}, sys {1e6*(r1.ru_stime-r0.ru_stime)/N:.1f}); fsyncs {own.stats['fsyncs']}")
    if prof:
        st = pstats.Stats(prof); st.sort_stats("tottime").print_stats(30)
    import shutil; shutil.rmtree(tmp, ignore_errors=True)   # noqa: E702 — no run pays for the last one's writeback
    os._exit(0)
uvloop.run(main())
