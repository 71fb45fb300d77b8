"""Entry point of every child process: `python -m agentos.child ROLE INDEX RUN_DIR PARENT_PID`.

The table below is the only list of roles; each module is imported only in its own process,
so an actor never pays for aiohttp's server or DuckDB.
"""
from __future__ import annotations

import importlib
import sys

from agentos import config as config_mod
from agentos import cpu_layout, native_memory, role_lock, service
from agentos.rundir import RunDir
from broker.sharding import STORE, log_writer

ROLES = {
    "broker": "broker.process",
    "writer-log": "storage.log_writer",
    "writer-store": "storage.store_process",
    "gateway": "gateway.process",
    "scheduler": "actors.scheduler_process",
    "actor": "actors.actor_process",
    "mock-llm": "bench.mock_process",
}


def process_name(role: str, index: int) -> str:
    """Bus and title name: `actor/3`, `writer/log/0`, `writer/store`, `scheduler`."""
    if role in ("actor", "gateway"):
        return f"{role}/{index}"
    if role == "writer-log":
        return log_writer(index)
    if role == "writer-store":
        return STORE
    return role


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] not in ROLES:
        print("usage: python -m agentos.child ROLE INDEX RUN_DIR PARENT_PID", file=sys.stderr)
        return service.EXIT_CONFIG
    role, index, run_dir, parent = args[0], int(args[1]), RunDir(args[2]), int(args[3])
    name = process_name(role, index)
    native_memory.limit_arenas()   # before any thread starts
    service.set_title(name)
    service.die_with_parent(parent)
    log = service.setup_logging(name)
    if not role_lock.hold(run_dir, name, log):   # another process of this role lives on
        return service.EXIT_FAILURE
    try:
        config = config_mod.from_dict(run_dir.read_json(run_dir.config_path))
    except (OSError, ValueError) as exc:
        log.error("cannot read the resolved config in %s: %s", run_dir.path, exc)
        return service.EXIT_CONFIG
    try:
        gateway_cpu = run_dir.read_json(run_dir.placement_path).get("gateway_cpu")
    except (OSError, ValueError, AttributeError):
        gateway_cpu = None              # the last CPU, as without a claim
    cpu_layout.place(role, config, log, gateway_cpu)   # before the role starts a thread
    module = importlib.import_module(ROLES[role])
    return module.main(config, index, run_dir, log)


if __name__ == "__main__":
    sys.exit(main())
