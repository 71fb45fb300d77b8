"""DBOS Transact as a peer of the step benchmark (`agent-os bench steps --peer dbos`): durable
workflows as a Python library on PostgreSQL, which is what a team picks instead of a server.

Owns: a private PostgreSQL for the lifetime of the block (bench/peer_pgredis.py's
`ReferenceStack`, without Redis; `synchronous_commit=on`, in a database of its own) and one
`python -m bench.dbos_app` process per run, which starts DBOS, runs the scenario's closed loop in
its own event loop and prints the row. Never does: define the scenarios (bench/dbos_app.py does,
with what each one times) or write results.

    from bench.peer_dbos import DbosPeer, run_scenario, SCENARIOS
    with DbosPeer() as dbos:
        row = run_scenario(dbos, "sync_steps", clients=128, warmup_secs=3, duration_secs=10)

(the shape of bench/peer_restate.py's API, so the step benchmark drives both alike).

DBOS and its PostgreSQL driver are in the `dev` extra.
"""
from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from typing import Self

from bench.dbos_app import SCENARIOS

__all__ = ["SCENARIOS", "DbosPeer", "run_scenario"]   # SCENARIOS: what this peer offers

RUN_GRACE_SECS = 120.0   # a run's process past warm-up + duration: DBOS's start, setup and drain


class DbosPeer:
    def __init__(self, tmp_root: str | None = None) -> None:
        self.tmp_root = tmp_root
        self.stack = None
        self.dsn = ""

    def __enter__(self) -> Self:
        from bench.peer_pgredis import ReferenceStack

        self.stack = ReferenceStack(self.tmp_root, redis=False).__enter__()
        try:
            self.dsn = self.stack.database("dbos")
        except BaseException:
            self.stack.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.stack is not None:
            self.stack.__exit__(*exc_info)
            self.stack = None

    def run(self, scenario: str, clients: int, warmup_secs: float, duration_secs: float) -> dict:
        """One closed-loop run in a fresh DBOS process: its row (see bench/dbos_app.py)."""
        cmd = [sys.executable, "-m", "bench.dbos_app", "--dsn", self.dsn, "--scenario", scenario,
               "--clients", str(clients), "--warmup", str(warmup_secs), "--duration", str(duration_secs),
               "--postgres-pid", str(self.stack.pids()[0])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=warmup_secs + duration_secs + RUN_GRACE_SECS)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"the DBOS run of {scenario} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(lines[-1])

    def versions(self) -> dict:
        return {"dbos": version("dbos"), "sqlalchemy": version("sqlalchemy"), "psycopg": version("psycopg"),
                "postgres": (self.stack.info if self.stack else {}).get("postgres_version", "")}


def run_scenario(peer: DbosPeer, scenario: str, clients: int, warmup_secs: float, duration_secs: float) -> dict:
    return peer.run(scenario, clients, warmup_secs, duration_secs)
