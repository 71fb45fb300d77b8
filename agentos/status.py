"""`agent-os status`: the live process table with memory and queue depths.

Reads the supervisor's table from the run directory, memory from /proc/PID/smaps_rollup
(VmRSS counts shared pages such as the interpreter; Private_Dirty is what each process really
costs), and asks every role for its stats over the bus.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agentos.config import Config
from agentos.rundir import RunDir
from broker.address import bus_address
from broker.client import Bus, BusError
from broker.protocol import BROKER, Kind
from broker.sharding import log_writer


MEMORY_KEYS = ("rss_kib", "private_dirty_kib", "private_kib", "pss_kib")


def proc_memory(pid: int) -> dict[str, int]:
    """Memory of one process in KiB: rss, private_dirty, private (clean + dirty), pss."""
    out = dict.fromkeys(MEMORY_KEYS, 0)
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return out
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    out["rss_kib"] = fields.get("Rss", 0)
    out["pss_kib"] = fields.get("Pss", 0)
    out["private_dirty_kib"] = fields.get("Private_Dirty", 0)
    out["private_kib"] = fields.get("Private_Dirty", 0) + fields.get("Private_Clean", 0)
    return out


def tree_memory(pids: list[int]) -> dict[str, int]:
    total = dict.fromkeys(MEMORY_KEYS, 0)
    for pid in pids:
        for key, value in proc_memory(pid).items():
            total[key] += value
    return total


async def query_stats(address, names: list[str], timeout: float = 1.5) -> dict[str, Any]:
    bus = Bus(f"cli/{os.getpid()}", address, role="cli")
    await bus.start()
    try:
        async def one(name: str) -> tuple[str, Any]:
            try:
                reply = await bus.request(name, Kind.STATS, {}, timeout=timeout, attempt_secs=timeout)
                return name, reply.body["stats"]
            except BusError as exc:
                return name, {"error": str(exc)}
        return dict(await asyncio.gather(*(one(n) for n in [BROKER, *names])))
    finally:
        await bus.close()


def process_table(run_dir: RunDir) -> dict | None:
    """The running server's process table from its run directory; None if no server runs there."""
    try:
        table = run_dir.read_json(run_dir.processes_path)
    except (OSError, ValueError):
        return None
    return table if Path(f"/proc/{table['supervisor']['pid']}").exists() else None


def collect(config: Config, memory: bool = True) -> dict[str, Any]:
    """What `agent-os status --json` prints. `memory=False` leaves out each process's memory
    (and the total), for callers that poll for stats: a process's smaps_rollup costs the kernel
    a walk of its mappings, 1.3-4.8 ms of CPU a read here."""
    run_dir = RunDir.for_config(config)
    table = process_table(run_dir)
    if table is None:
        return {"running": False, "run_dir": str(run_dir.path), "processes": []}
    supervisor_pid = table["supervisor"]["pid"]
    now = time.time()
    rows = [{"name": "supervisor", "role": "supervisor", "pid": supervisor_pid,
             "uptime_secs": round(now - table["supervisor"]["started_at"], 1), "restarts": 0}]
    forks = table.get("forkserver") or {}
    if forks.get("pid"):
        rows.append({"name": "forkserver", "role": "forkserver", "pid": forks["pid"],
                     "uptime_secs": round(now - forks["started_at"], 1) if forks.get("started_at") else None,
                     "restarts": forks.get("restarts", 0)})
    for child in table["children"]:
        rows.append({"name": child["name"], "role": child["role"], "pid": child["pid"],
                     "uptime_secs": round(now - child["started_at"], 1) if child["started_at"] else None,
                     "restarts": child["restarts"]})
    if memory:
        for row in rows:
            if row["pid"]:
                row.update(proc_memory(row["pid"]))
    bus_names = [c["name"] for c in table["children"] if c["pid"] and c["role"] in ("gateway", "scheduler", "actor", "writer-log", "writer-store")]
    gateway_log = log_writer(config.gateway_log_index) if config.gateway_log_index is not None else None
    stats = asyncio.run(query_stats(bus_address(config, run_dir), bus_names + ([gateway_log] if gateway_log else [])))
    for row in rows:
        row["stats"] = stats.get(row["name"] if row["role"] != "broker" else BROKER, {})
        if row["role"] == "gateway" and gateway_log:
            row["stats"] = {**row["stats"], "log": stats.get(gateway_log, {})}   # the log it writes itself
    gateway = stats.get("gateway/0", {})
    actors = [s for n, s in stats.items() if n.startswith("actor/")]
    writers = [(r, stats.get(r["name"], {})) for r in rows if r["role"] == "writer-log"]
    writers += [(r, r["stats"]["log"]) for r in rows if r["role"] == "gateway" and gateway_log]
    return {
        "running": True, "run_dir": str(run_dir.path), "listen": table.get("listen"),
        "gateway_port": table.get("gateway_port"), "processes": rows,
        "in_flight_turns": gateway.get("in_flight"), "admission_limit": gateway.get("admission_limit"),
        "active_sessions": sum(a.get("sessions", 0) for a in actors),
        **({"memory_total": {key: sum(r[key] for r in rows if r["pid"]) for key in MEMORY_KEYS}} if memory else {}),
        "object_storage": object_storage(config, writers),
        "disk": disk(config),
    }


def disk(config: Config) -> dict[str, Any] | None:
    """The data directory's filesystem, each log's compaction reserve (storage/compaction_reserve.py)
    and the free space below which the logs take no appends (storage/free_space.py)."""
    from storage import compaction_reserve, free_space
    volumes = compaction_reserve.volumes(config.storage.dir)
    if "wal" in volumes and volumes["wal"]["device"] == volumes.get("data", {}).get("device"):
        del volumes["wal"]     # one filesystem for both
    reserves = {}
    for directory in sorted(Path(config.storage.dir, "wal").glob("[0-9]*")):
        try:
            reserves[directory.name] = (directory / compaction_reserve.NAME).stat().st_size
        except OSError:
            reserves[directory.name] = 0
    if not volumes:
        return None
    logs = volumes.get("wal", volumes["data"])
    floor = free_space.margin(config.storage.min_free_bytes, config.storage.segment_bytes, logs["total_bytes"])
    return {"volumes": volumes, "compaction_reserves": reserves, "logs_min_free_bytes": floor}


def object_storage(config: Config, writers: list[tuple[dict, dict]]) -> dict[str, Any] | None:
    """PUTs per second since the writers started (log batches) plus lease renewals, and what
    that costs per hour at `cluster.put_price_per_1000`."""
    if not config.storage.s3.bucket:
        return None
    puts_per_sec = 1.0 / config.cluster.lease_renew_secs
    batches = puts = 0
    for row, stats in writers:
        s3 = stats.get("s3") or {}
        if row.get("uptime_secs"):
            puts_per_sec += s3.get("puts", 0) / row["uptime_secs"]
        batches += s3.get("batches", 0)
        puts += s3.get("puts", 0)
    return {"bucket": config.storage.s3.bucket, "puts_per_sec": round(puts_per_sec, 3),
            "batches_per_put": round(batches / puts, 2) if puts else None,
            "usd_per_hour": round(puts_per_sec * 3600 * config.cluster.put_price_per_1000 / 1000, 4)}


def _queue(stats: dict) -> str:
    bus = stats.get("bus", {})
    parts = [f"outbox={bus['outbox']}"] if "outbox" in bus else []
    for key in ("waiting", "streams", "turns_running", "permits_waiting", "queued_records", "waiting_messages",
                "lag_records", "waiting_queries"):
        if key in stats:
            parts.append(f"{key}={stats[key]}")
    return " ".join(parts) or ("unreachable" if "error" in stats else "-")


def flow_queues(processes: list[dict]) -> str | None:
    """A line of each flow queue's runs, as the scheduler counts them (None: there are none)."""
    stats = next((r.get("stats") or {} for r in processes if r["name"] == "scheduler"), {})
    parts = []
    for name, q in (stats.get("flow_queues") or {}).items():
        limit = "*" if q["limit"] is None else q["limit"]
        if "keys" in q:   # (a queue per key or per tenant: its limit holds for each key)
            text = f"{name} {q['running']} running, {q['waiting']} waiting, over {q['keys']} keys ({limit} at once each)"
        else:
            text = f"{name} {q['running']}/{limit} running, {q['waiting']} waiting"
        if "started_in_window" in q:
            text += f", {q['started_in_window']} admitted in its rate's window"
        parts.append(text)
    return "flow queues: " + "; ".join(parts) if parts else None


def main(config: Config, as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    data = collect(config)
    if as_json:
        print(json.dumps(data, indent=1), file=out)
        return 0 if data["running"] else 1
    if not data["running"]:
        print(f"agent-os is not running (run dir {data['run_dir']})", file=out)
        return 1
    print(f"agent-os on {data['listen']} (port {data['gateway_port']}), run dir {data['run_dir']}", file=out)
    print(f"in-flight turns: {data['in_flight_turns']}  admission limit: {data['admission_limit']}  "
          f"active sessions: {data['active_sessions']}", file=out)
    print(f"{'NAME':<12} {'PID':>7} {'UPTIME':>9} {'RESTARTS':>8} {'RSS MiB':>8} {'PRIV_DIRTY MiB':>14}  QUEUES", file=out)
    for r in data["processes"]:
        uptime = f"{r['uptime_secs']:.0f}s" if r.get("uptime_secs") is not None else "-"
        print(f"{r['name']:<12} {r['pid'] or '-':>7} {uptime:>9} {r['restarts']:>8} "
              f"{r.get('rss_kib', 0) / 1024:>8.1f} {r.get('private_dirty_kib', 0) / 1024:>14.1f}  "
              f"{_queue(r.get('stats', {}))}", file=out)
    queues = flow_queues(data["processes"])
    if queues:
        print(queues, file=out)
    s3 = data.get("object_storage")
    if s3:
        print(f"object storage: bucket {s3['bucket']}, {s3['puts_per_sec']} PUTs/s "
              f"({s3['batches_per_put'] or '-'} batches per PUT), est. ${s3['usd_per_hour']}/hour in requests",
              file=out)
    room = data.get("disk")
    if room:
        reserves = ", ".join(f"log {name} {size / 2**20:.0f} MiB" if size else f"log {name} none"
                             for name, size in room["compaction_reserves"].items())
        free = "; ".join(f"{name} {v['free_bytes'] / 2**30:.2f} GiB free of {v['total_bytes'] / 2**30:.2f}"
                         for name, v in room["volumes"].items())
        floor = room["logs_min_free_bytes"]
        store = " and what the store has yet to load" if "wal" not in room["volumes"] else ""   # on their disk
        print(f"disk: {free}; compaction reserves: {reserves or '-'}; "
              + (f"logs take appends down to {floor / 2**20:.1f} MiB free{store}" if floor
                 else "logs take appends to the last byte"), file=out)
    mem = data["memory_total"]
    print(f"tree: RSS {mem['rss_kib'] / 1024:.1f} MiB, Private_Dirty {mem['private_dirty_kib'] / 1024:.1f} MiB", file=out)
    return 0
