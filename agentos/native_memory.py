"""glibc malloc settings for long-running processes with native threads (glibc only; a no-op
elsewhere).

Why: glibc gives each thread that allocates its own arena (up to 8 per core), and memory freed
in one arena is not reused by another or handed back to the system until the arena's top is
free. writer/store runs DuckDB, which starts ~9 threads per database file, plus its loader and
query threads: a 30-minute soak saw 15 arenas there, each holding its own fragments, and the
process's private memory creep 20–25% above where it was after warm-up. Two arenas keep the
threads' freed memory in few places where it is reused; a fixed mmap threshold makes buffers of
a megabyte and more (a batch of log records read at once) go back to the system when freed,
instead of raising the threshold and growing the heap.

Fixing the mmap threshold also fixes the trim threshold at glibc's default, 128 KiB, unless it is
set too: then whenever more than that is free at the top of the heap it goes back to the system,
and the next big buffers fault it in again. Packing a 160 KiB reply cost 121 µs that way against
12 µs; an actor answering reads of ten 16 KiB attributes took 30 page faults per read at a 2 MiB
trim threshold (its replies in flight, freed together, came to ~2 MiB) and none at 8 MiB
(bench/results/2026-12-04-spill-*). So up to 8 MiB of freed heap stays with a process.

Between bursts it need not: every process run by agentos/service.py hands its heap's free pages
back once a minute (`release_free_memory`, ~0.14 ms for a few MiB here), so what a burst left
free does not stay counted to the process for good. (It is not what made the gateway's private
memory step up late in two 30-minute soaks: those steps came at the same points of the load
with and without it; bench/results/2026-12-04-soak-dec04-thirtyeighth*.)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENAS = 2
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_THRESHOLD_BYTES = 8 * MMAP_THRESHOLD_BYTES
STORE_TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES   # writer/store's (storage/store_process.py)


@functools.cache
def _libc():   # cached: find_library runs a program to look (~1.4 ms)
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def limit_arenas() -> bool:
    """Call before the process starts threads. True if glibc took the settings."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return (bool(libc.mallopt(M_ARENA_MAX, ARENAS)) and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
            and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)))


def keep_freed_heap(trim_bytes: int) -> bool:
    """Keep up to `trim_bytes` of freed memory at the top of the heap rather than hand it back
    (for a load generator, whose memory does not matter and whose CPU does).

    The mmap threshold is fixed too, at the tree's MMAP_THRESHOLD_BYTES: setting the trim
    threshold alone fixes it at glibc's default, 128 KiB, and then every msgpack.packb (whose
    buffer is 256 KiB) maps and unmaps pages of its own — a map, an unmap and 6 page faults for a
    22 KB body: the benchmarks' CPU workload (bench/cpu_speed.py) read 22-26 µs in `agent-os
    bench` against 10-11 in a plain process, from 2026-12-04's evening, when this came in, to
    2026-12-08."""
    libc = _libc()
    return (libc is not None and hasattr(libc, "mallopt") and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
            and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_bytes)))


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
