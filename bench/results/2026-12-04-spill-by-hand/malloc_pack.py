import sys, time, msgpack
from agentos import native_memory
if sys.argv[1] != "none":
    native_memory.limit_arenas()
if sys.argv[1] == "trim":
    native_memory._libc().mallopt(-1, 1 << 20)
attrs = {f"k{i}": "x" * (16 * 1024) for i in range(10)}
body={"found":True,"values":attrs}
p=msgpack.Packer(use_bin_type=True).pack
n=5000
t=time.perf_counter()
for _ in range(n): b=p(body); x=b"".join((b"abc", b)); del b, x
print(sys.argv[1], "pack+join us", (time.perf_counter()-t)/n*1e6)
