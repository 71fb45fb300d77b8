"""How a checkpoint-benchmark worker talks to one store: our server, or PostgreSQL + Redis.

Owns: the two targets and their per-worker clients — `AgentOSTarget` (our HTTP checkpoint
routes, one keep-alive connection per worker on `actors.http1`) and `PgRedisTarget` (the
reference stack: one asyncpg connection and one redis.asyncio connection per worker) —
and the `CheckpointError` every failure becomes. Never does: timing, counting, or starting and
stopping servers (the runner and `bench.peer_pgredis` do that).

A worker client has three calls, each bounded by the op timeout: `commit(agent, task, payload)`
returns once the store says the checkpoint is durable, `read_latest(agent)` returns the latest
checkpoint's `(task, payload length)` or None, and `close()`. A client whose connection broke
or timed out reconnects on its next call. Add a new target to `TARGETS`.

Why the hand-written HTTP client (`actors.http1`) rather than aiohttp's: measured on this
machine, one worker doing PUT (2–40 KB) + GET latest against an aiohttp server in another
process, it costs ~220–260 µs of client CPU per PUT+GET pair where aiohttp's ClientSession (one
keep-alive connection) costs ~560–590 µs. On two cores shared with the server, that matters.
"""
from __future__ import annotations

import asyncio
import glob
import os
from array import array
from time import perf_counter
from typing import ClassVar, NamedTuple
from urllib.parse import quote

import orjson

from actors.http1 import (
    BufferedResponse, HttpConnection, build_request, open_connection, parse_endpoint,
)

MAX_READ_BYTES = 16 << 20  # a latest checkpoint bigger than this is a bug in the benchmark


class CheckpointError(Exception):
    """One failed op. `kind`: http (see status), broken, timeout, bad_response, db, redis."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(f"{kind}{f' {status}' if status else ''}: {message}")
        self.kind, self.status, self.message = kind, status, message

    @property
    def label(self) -> str:
        return f"{self.kind}_{self.status}" if self.status else self.kind


class Latest(NamedTuple):
    task: int  # -1 when the store holds a key that is not a task index
    nbytes: int | None  # None when the pointer names a checkpoint that is not there


def process_tree_cpu_secs(root_pids: list[int]) -> float:
    """CPU seconds (user + system, plus reaped children) of these processes and all their live
    descendants — a server's side of a run. By tree, not by process group: PostgreSQL puts each
    backend in a group (and session) of its own. Linux /proc only."""
    if not root_pids:
        return 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            pid = int(stat.split("/")[2])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        # after the name: state, ppid, …; utime, stime, cutime, cstime are fields 14–17
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])
    inside: set[int] = set(root_pids)
    total = 0
    for pid, used in ticks.items():
        chain, p = [], pid
        while p > 1 and p not in inside and len(chain) < 64:
            chain.append(p)
            p = parent.get(p, 0)
        if p in inside:
            inside.update(chain)
            total += used
    return total / os.sysconf("SC_CLK_TCK")


def _error_text(body: bytes) -> str:
    try:
        err = orjson.loads(body)["error"]
        return f"{err.get('code')}: {err.get('message')}"
    except Exception:  # noqa: BLE001 — not our JSON error shape: show the raw text instead
        return body[:200].decode("utf-8", "replace")


async def within_timeout(worker, op):
    """`worker._connect()`, then `op()`, both within the op timeout. A worker that timed out has its
    connections closed: they are in an unknown state, never to be reused."""
    try:
        async with asyncio.timeout(worker.t.op_timeout_secs):
            await worker._connect()
            return await op()
    except TimeoutError as exc:
        await worker.close()
        raise CheckpointError("timeout", f"no answer in {worker.t.op_timeout_secs:g}s") from exc


# ------------------------------------------------------------------------------------- agentos
class AgentOSWorker:
    """One keep-alive HTTP/1.1 connection; request heads are built per call (payloads differ)."""

    def __init__(self, target: AgentOSTarget) -> None:
        self.t = target
        self.conn: HttpConnection | None = None

    async def _exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        t = self.t
        loop = asyncio.get_running_loop()
        try:
            if self.conn is None or self.conn.closed:
                self.conn = await open_connection(t.endpoint, t.op_timeout_secs)
        except (OSError, TimeoutError) as exc:
            raise CheckpointError("broken", f"connect failed: {exc!r}") from exc
        conn = self.conn
        future = loop.create_future()
        timed_out = []
        timer = loop.call_later(t.op_timeout_secs, lambda: (timed_out.append(1), conn.abort()))
        try:
            conn.send(request, BufferedResponse(future, MAX_READ_BYTES))
            return await future
        except ConnectionError as exc:
            if timed_out:
                raise CheckpointError("timeout", f"no answer in {t.op_timeout_secs:g}s") from exc
            raise CheckpointError("broken", str(exc)) from exc
        finally:
            timer.cancel()

    async def commit(self, agent: str, task: int, payload: bytes) -> None:
        t = self.t
        request = build_request(t.endpoint, "PUT", f"{t.path(agent)}/{task}", payload,
                                t.put_headers)
        status, _, body = await self._exchange(request)
        if status != 200:
            raise CheckpointError("http", _error_text(body), status)
        try:
            ack = orjson.loads(body)
            durability = ack["durability"]
            if ack["key"] != str(task):
                raise ValueError(f"acked key {ack['key']!r}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError("bad_response", f"PUT ack: {exc!r}") from exc
        t.durability_seen.add(str(durability))

    async def read_latest(self, agent: str) -> Latest | None:
        t = self.t
        status, headers, body = await self._exchange(
            build_request(t.endpoint, "GET", f"{t.path(agent)}/latest", None, t.get_headers))
        if status == 404:
            return None
        if status != 200:
            raise CheckpointError("http", _error_text(body), status)
        key = headers.get("x-checkpoint-key", "")
        return Latest(int(key) if key.isdigit() else -1, len(body))

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class AgentOSTarget:
    """Our server's checkpoint routes; the server is started by whoever passes its URL. Also the
    client of the other servers that speak them (`name`: `agentos-none`, `noop-http`, `fsync-http`)."""

    def __init__(self, url: str, op_timeout_secs: float, api_key: str | None = None,
                 server_pids: list[int] | None = None, name: str = "agentos") -> None:
        self.name = name
        self.url = url
        self.server_pids = list(server_pids or [])  # whoever started the server may pass them
        self.endpoint = parse_endpoint(url)
        self.op_timeout_secs = op_timeout_secs
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.put_headers = {"Content-Type": "application/octet-stream", **auth}
        self.get_headers = dict(auth)
        self.durability_seen: set[str] = set()
        self.data_dirs: list[str] = []   # the server's storage.dir when we started it (its disk use is reported)
        self.log_path: str | None = None  # its log, when we started it

    @staticmethod
    def path(agent: str) -> str:
        return f"/v1/sessions/{quote(agent, safe='')}/checkpoints"

    async def open_worker(self) -> AgentOSWorker:
        return AgentOSWorker(self)

    def describe(self) -> dict:
        return {"url": self.url, "client": "actors.http1 (keep-alive, 1 conn/worker)",
                "durability_acked": sorted(self.durability_seen)}


# ------------------------------------------------------------------------------------- pgredis
UPSERT = ("INSERT INTO checkpoints (agent, task, payload) VALUES ($1, $2, $3) "
          "ON CONFLICT (agent, task) DO UPDATE SET payload = EXCLUDED.payload, created_at = now()")
SELECT = "SELECT payload FROM checkpoints WHERE agent = $1 AND task = $2"
POINTER_TTL_SECS = 3600
PARTS = ("pg_upsert", "redis_setex", "redis_get", "pg_select")


class PgRedisWorker:
    """One asyncpg connection and one Redis connection (the latest-state pointer).

    The upsert runs outside an explicit transaction: PostgreSQL commits it on its own and, with
    synchronous_commit=on, answers only after the WAL fsync — as durable as INSERT + COMMIT and
    one round trip cheaper, the fairest shape for the reference. asyncpg prepares and caches
    both statements on first use. Client CPU per op, measured here (sequential, 20 KB payload):
    upsert 144 µs on asyncpg vs 274 µs on psycopg 3 async; SETEX ~170 µs on redis.asyncio
    (hiredis does not change it; a bare asyncio stream costs ~57 µs).
    """

    def __init__(self, target: PgRedisTarget) -> None:
        self.t = target
        self.pg = None
        self.redis = None
        # Each store's share of the op, so a slow commit can be put on PostgreSQL or on Redis
        # (the article's "Postgres commit p99" is the first of these alone).
        self.parts_ms: dict[str, array] = {name: array("d") for name in PARTS}

    async def _connect(self) -> None:
        import asyncpg
        import redis.asyncio as aredis

        if self.pg is None or self.pg.is_closed():
            self.pg = await asyncpg.connect(self.t.pg_dsn)
        if self.redis is None:
            self.redis = aredis.Redis.from_url(self.t.redis_url, single_connection_client=True)

    async def _guarded(self, op):
        import asyncpg
        import redis

        try:
            return await within_timeout(self, op)
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if self.pg is not None and self.pg.is_closed():
                await self.close()
            raise CheckpointError("db", repr(exc)[:300]) from exc
        except (redis.RedisError, OSError) as exc:
            await self.close()
            raise CheckpointError("redis", repr(exc)[:300]) from exc

    async def commit(self, agent: str, task: int, payload: bytes) -> None:
        async def op() -> None:
            t0 = perf_counter()
            await self.pg.execute(UPSERT, agent, task, payload)
            t1 = perf_counter()
            # SETEX itself (redis-py deprecates its setex() helper in favour of SET … EX).
            await self.redis.execute_command("SETEX", f"latest:{agent}", POINTER_TTL_SECS, task)
            parts = self.parts_ms
            parts["pg_upsert"].append((t1 - t0) * 1000)
            parts["redis_setex"].append((perf_counter() - t1) * 1000)

        await self._guarded(op)

    async def read_latest(self, agent: str) -> Latest | None:
        async def op() -> Latest | None:
            t0 = perf_counter()
            pointer = await self.redis.execute_command("GET", f"latest:{agent}")
            t1 = perf_counter()
            self.parts_ms["redis_get"].append((t1 - t0) * 1000)
            if pointer is None:
                return None
            task = int(pointer) if pointer.isdigit() else -1
            payload = await self.pg.fetchval(SELECT, agent, task)
            self.parts_ms["pg_select"].append((perf_counter() - t1) * 1000)
            return Latest(task, None if payload is None else len(payload))

        return await self._guarded(op)

    async def close(self) -> None:
        pg, self.pg = self.pg, None
        client, self.redis = self.redis, None
        if pg is not None:
            try:
                await asyncio.wait_for(pg.close(), 5)
            except Exception:  # noqa: BLE001 — a broken connection cannot close politely
                pg.terminate()
        if client is not None:
            await client.aclose()


class PgRedisTarget:
    """The reference stack; `pg_dsn` and `redis_url` come from a running `ReferenceStack`."""

    name: ClassVar[str] = "pgredis"

    def __init__(self, pg_dsn: str, redis_url: str, op_timeout_secs: float,
                 stack_info: dict | None = None, server_pids: list[int] | None = None) -> None:
        self.pg_dsn, self.redis_url = pg_dsn, redis_url
        self.server_pids = list(server_pids or [])
        self.op_timeout_secs = op_timeout_secs
        self.stack_info = stack_info or {}
        self.data_dirs = [self.stack_info["data_dir"]] if "data_dir" in self.stack_info else []

    async def open_worker(self) -> PgRedisWorker:
        return PgRedisWorker(self)

    def describe(self) -> dict:
        return {"client": "asyncpg (prepared, no explicit transaction) + redis.asyncio, "
                          "1 connection each per worker", **self.stack_info}


TARGETS = ("agentos", "pgredis", "langgraph")   # langgraph: bench/peer_langgraph.py
# Not run unless named: where a commit's time goes. `agentos-none` is our server with
# `storage.durability: none` (every process, no fsync); `noop-http` answers the same routes and
# does nothing else (bench/noop_http.py): the client and one HTTP exchange; `fsync-http` is that
# server group-committing the bodies to a file: the floor of a durable server in one process.
LAYER_TARGETS = ("agentos-none", "noop-http", "fsync-http")
