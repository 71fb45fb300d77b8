"""writer/log's recent ids, before (a dict of id -> time plus a (time, id) queue, 58af579) and
after (generations of sets, 21abca4): memory an id held, what is left once the horizon has
passed, and the time of the writer's per-record check and add.

    .venv/bin/python bench/results/2026-12-05-recent-ids-memory-fortieth/recent_ids_memory.py
(from the repository's root; it reads the "before" module out of git)
"""
import gc
import json
import subprocess
import sys
import time
import tracemalloc
import types

from storage import recent_ids as after


def module_at(commit: str, path: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"before_{commit}")
    sys.modules[module.__name__] = module   # dataclass-free, but annotations resolve against it
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
    return module


def ids(n: int) -> list[bytes]:
    return [b"actor/0:1a2b3c:%d" % i for i in range(n)]   # LogClient.new_id's shape


def fill(mod, batch: list[bytes], step: float = 1e-4):
    """The writer's path: a miss, an add, expire per message of 10. One id per `step` seconds:
    1e-4 keeps every id (50 s of 500k), 1e-3 is a steady state of ~60k ids, aging out as new come."""
    r = mod.RecentIds()
    for i, record_id in enumerate(batch):
        if record_id in r:
            raise SystemExit("a new id was taken for a duplicate")
        r.add(record_id, 1000.0 + i * step)
        if i % 10 == 0:
            r.expire(1000.0 + i * step)
    return r


rows = []
before = module_at("58af579", "storage/recent_ids.py")
for label, mod in (("before", before), ("after", after)):
    for n in (60_000, 500_000):
        batch = ids(n)
        own = sum(map(sys.getsizeof, batch))
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        r = fill(mod, batch)
        held = tracemalloc.get_traced_memory()[0] - base
        r.expire(1000.0 + 61 + n * 1e-4)
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del r
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            fill(mod, batch)
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        steady = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            fill(mod, batch, step=1e-3)
            steady = min(steady, (time.perf_counter() - t0) / n * 1e6)
        rows.append({"code": label, "ids": n, "held_bytes": held, "ids_own_bytes": own,
                     "steady_state_us_per_id": round(steady, 3),
                     "bytes_per_id_beside_the_id": round(held / n, 1),
                     "bytes_per_id_with_the_id": round((held + own) / n, 1),
                     "left_after_horizon_bytes": left, "check_add_us_per_id": round(best, 3)})
        print(json.dumps(rows[-1]))
