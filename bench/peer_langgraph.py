"""LangGraph's Postgres checkpointer as a target of the checkpoint benchmark (`--targets langgraph`):
what a LangGraph user runs to make an agent's steps durable, on the same disk, in the same kind
of private PostgreSQL as the reference stack (`synchronous_commit=on`, no Redis: LangGraph finds
a thread's latest checkpoint in PostgreSQL itself).

Owns: the `langgraph` target and its per-worker clients. Each worker holds one psycopg 3 async
connection set up as LangGraph's README asks (autocommit, dict rows, no prepared statements) and
one `AsyncPostgresSaver` on it. A commit is one `aput` of a checkpoint whose only channel holds
the payload (bytes, so LangGraph writes it to `checkpoint_blobs` with a fresh channel version, and
the checkpoint row to `checkpoints`, in one pipeline); a read is `aget_tuple` of the thread's
newest checkpoint with its blob. That is the least a LangGraph step writes: a graph's step also
`aput_writes` its nodes' writes, which this leaves out, so the target is LangGraph at its
cheapest. Never does: start PostgreSQL (`bench.peer_pgredis.ReferenceStack`, in a database of
its own: LangGraph's table `checkpoints` is named like the reference's), timing or counting.

The packages (`langgraph-checkpoint-postgres`, `psycopg[binary]`) are in the `dev` extra.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar, Iterator

from bench.checkpoint_targets import CheckpointError, Latest, within_timeout

CHANNEL = "state"   # the one channel of the benchmark's graph: the agent's serialized state


class LangGraphWorker:
    def __init__(self, target: LangGraphTarget) -> None:
        self.t = target
        self.conn = None
        self.saver = None
        self.versions: dict[str, str] = {}   # agent -> its channel's version this worker last wrote
        self.newest: dict[str, str] = {}     # agent -> the id of its checkpoint this worker last wrote

    async def _connect(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        if self.conn is None or self.conn.closed:
            self.conn = await AsyncConnection.connect(self.t.dsn, autocommit=True, prepare_threshold=0,
                                                      row_factory=dict_row)
            self.saver = AsyncPostgresSaver(self.conn)

    async def _guarded(self, op):
        import psycopg

        try:
            return await within_timeout(self, op)
        except (psycopg.Error, OSError) as exc:
            if self.conn is not None and self.conn.closed:
                await self.close()
            raise CheckpointError("db", repr(exc)[:300]) from exc

    async def commit(self, agent: str, task: int, payload: bytes) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        async def op() -> None:
            version = self.saver.get_next_version(self.versions.get(agent), None)
            checkpoint = empty_checkpoint()
            checkpoint.update(id=str(uuid6(clock_seq=task)), channel_values={CHANNEL: payload},
                              channel_versions={CHANNEL: version})
            configurable = {"thread_id": agent, "checkpoint_ns": ""}
            if agent in self.newest:
                configurable["checkpoint_id"] = self.newest[agent]   # its parent
            await self.saver.aput({"configurable": configurable}, checkpoint,
                                  {"source": "loop", "step": task, "parents": {}}, {CHANNEL: version})
            self.versions[agent], self.newest[agent] = version, checkpoint["id"]

        await self._guarded(op)

    async def read_latest(self, agent: str) -> Latest | None:
        async def op() -> Latest | None:
            found = await self.saver.aget_tuple({"configurable": {"thread_id": agent, "checkpoint_ns": ""}})
            if found is None:
                return None
            payload = found.checkpoint["channel_values"].get(CHANNEL)
            version = found.checkpoint["channel_versions"].get(CHANNEL)
            if version is not None:
                self.versions[agent] = version
            self.newest[agent] = found.checkpoint["id"]
            step = found.metadata.get("step")
            return Latest(step if isinstance(step, int) else -1, None if payload is None else len(payload))

        return await self._guarded(op)

    async def close(self) -> None:
        conn, self.conn, self.saver = self.conn, None, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:  # noqa: BLE001 — a broken connection cannot close politely
                pass


class LangGraphTarget:
    """LangGraph's checkpointer on a database of a running `ReferenceStack`."""

    name: ClassVar[str] = "langgraph"

    def __init__(self, dsn: str, op_timeout_secs: float, stack_info: dict | None = None,
                 server_pids: list[int] | None = None) -> None:
        self.dsn = dsn
        self.op_timeout_secs = op_timeout_secs
        self.stack_info = stack_info or {}
        self.server_pids = list(server_pids or [])
        self.data_dirs = [self.stack_info["data_dir"]] if "data_dir" in self.stack_info else []

    async def open_worker(self) -> LangGraphWorker:
        return LangGraphWorker(self)

    def describe(self) -> dict:
        from importlib.metadata import version

        return {"client": "langgraph AsyncPostgresSaver on psycopg 3 (autocommit, 1 connection per worker); "
                          "one aput per checkpoint, aget_tuple per read",
                "langgraph_checkpoint_postgres": version("langgraph-checkpoint-postgres"),
                "psycopg": version("psycopg"), **self.stack_info}


@contextlib.contextmanager
def langgraph_started(tmp_root: str | None, op_timeout_secs: float) -> Iterator[LangGraphTarget]:
    """A private PostgreSQL with LangGraph's tables made (`setup()`), for the lifetime of the block."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import connect
    from psycopg.rows import dict_row

    from bench.peer_pgredis import ReferenceStack

    with ReferenceStack(tmp_root, redis=False) as stack:
        dsn = stack.database("langgraph")
        with connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
            PostgresSaver(conn).setup()
        yield LangGraphTarget(dsn, op_timeout_secs, stack.info, server_pids=stack.pids())
