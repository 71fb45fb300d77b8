"""glibc malloc settings (agentos/native_memory.py): a process that keeps allocating and freeing
big buffers must not hand the pages back and fault them in again each time."""
import subprocess
import sys

import pytest

from agentos import native_memory

CYCLES = """
import resource, sys
from agentos import native_memory
if sys.argv[1] == "ours":
    assert native_memory.limit_arenas()
else:   # the mmap threshold fixed as before, the trim threshold left at glibc's default
    assert native_memory._libc().mallopt(native_memory.M_MMAP_THRESHOLD, native_memory.MMAP_THRESHOLD_BYTES)

def cycle():   # 20 replies of 200 KB alive at once, then all freed
    held = [bytes(200_000) + b"x" for _ in range(20)]
    del held

cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def faults_per_cycle(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(native_memory._libc() is None or not hasattr(native_memory._libc(), "mallopt"),
                    reason="glibc only")
def test_big_buffers_freed_and_allocated_again_reuse_their_pages():
    assert faults_per_cycle("ours") < 20            # ~0: the freed heap is kept and reused
    assert faults_per_cycle("trim-default") > 500   # ~1,000 (20 x 49 pages): trimmed and faulted in again


PACKS = """
import resource, sys
import msgpack
from agentos import native_memory
assert native_memory.keep_freed_heap(256 << 20)   # as `agent-os bench` does, before anything is packed
body = {"payload": bytes(22528)}
msgpack.packb(body)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    msgpack.packb(body)   # (its buffer: 256 KiB, allocated and freed each call)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


@pytest.mark.skipif(native_memory._libc() is None or not hasattr(native_memory._libc(), "mallopt"),
                    reason="glibc only")
def test_a_load_generator_keeping_its_heap_packs_without_mapping_each_buffer():
    """Its trim threshold alone set, the mmap threshold stayed at 128 KiB: each pack mapped and
    unmapped a 256 KiB buffer of its own (6 faults for the pages a 22 KB body touched), and the
    benchmarks' CPU workload ran 2.4 times slower."""
    out = subprocess.run([sys.executable, "-c", PACKS], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 1, out.stdout   # 0 (6 before)


RELEASE = """
from agentos import native_memory
assert native_memory.limit_arenas()

def private_kib():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))

held = [bytes(200_000) + b"x" for _ in range(30)]   # 6 MB of heap, below the 8 MiB kept when freed
del held
kept = private_kib()
native_memory.release_free_memory()
print(kept - private_kib())
"""


@pytest.mark.skipif(native_memory._libc() is None or not hasattr(native_memory._libc(), "malloc_trim"),
                    reason="glibc only")
def test_the_freed_heap_kept_between_bursts_goes_back_when_released():
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 4000   # KiB: most of the 6 MB


def test_every_service_releases_its_free_heap_on_its_period(monkeypatch):
    """agentos/service.py's housekeeping: metrics each second, the free heap each period."""
    import asyncio

    from agentos import service
    real_sleep = asyncio.sleep
    ticks, released = [], []

    async def one_tick(_secs):
        ticks.append(1)
        await real_sleep(0)

    monkeypatch.setattr(service.asyncio, "sleep", one_tick)
    monkeypatch.setattr(native_memory, "release_free_memory", lambda: released.append(len(ticks)))

    async def go():
        task = asyncio.ensure_future(service._housekeeping(release_every=3))
        while len(ticks) < 10:
            await real_sleep(0)
        task.cancel()

    asyncio.run(go())
    assert released[:3] == [3, 6, 9]
