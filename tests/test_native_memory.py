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
