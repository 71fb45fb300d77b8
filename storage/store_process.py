"""The writer/store role: the DuckDB projection of the log, and read queries over the bus.

Loading runs on its own thread (`Store.run_loader`), queries on another. The event loop only
routes: it learns how far each log is durable from `log.flushed` notices (and asks a quiet log:
a notice can be lost; storage/store_progress.py), and the loader reads no further (a file may
hold a batch whose fdatasync has not returned, or failed and is zeroed back).
A `sync` query asks every writer where its log is durable now and is held until the loader has
passed that point, which gives readers read-your-writes. A writer joins the bus only once its log
is open (restored from the bucket on a fresh node), so a `sync` query waits for every writer:
before that, the files may end short of what the writer is about to restore, and an actor
recovering its runs would replay a journal with holes.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentos import metrics, native_memory, service
from agentos.config import Config
from agentos.rundir import RunDir
from broker.client import Bus, BusError
from broker.protocol import RUN_MATCH, Kind, Message
from broker.sharding import STORE
from storage import bucket_mending, payload_compaction, write_failures
from storage.store import Store
from storage.store_notices import LoadedNotices, ask_quiet_logs
from storage.store_progress import LogProgress
from broker.address import bus_address

PAYLOAD_PASS_SECS = 10.0   # a payload compaction pass stops after this long; the next goes on from there


class StoreService(LogProgress):
    def __init__(self, config: Config, bus_endpoint: str, log: logging.Logger) -> None:
        self.log = log
        self.config = config
        self.store = Store(Path(config.storage.dir), config.logs, config.storage.duckdb_memory_limit_mb,
                           config.storage.jsonl_dir, log, payload_segment_bytes=config.storage.segment_bytes,
                           min_free_bytes=config.storage.min_free_bytes)
        self.queries = ThreadPoolExecutor(1, thread_name_prefix="store-query")
        # a latest read whose place is known (storage/newest_blobs.py): one payload read, which need
        # not queue behind the queries (nor a reopen or a payload compaction's swap on their thread)
        self.payload_reads = ThreadPoolExecutor(1, thread_name_prefix="store-payload")
        self.maintenance = ThreadPoolExecutor(1, thread_name_prefix="store-compact")
        # compaction's and retention's questions and deletions (`Store.on_pass`), beside the reads
        self.passes = ThreadPoolExecutor(1, thread_name_prefix="store-pass")
        self.loader: ThreadPoolExecutor | None = None
        self.flushed: dict[int, int] = {}
        self.loaded: dict[int, int] = {}
        self.files_at_start: dict[int, int] = {}
        self.heard_at: dict[int, float] = {}   # log -> when its last `log.flushed` came (time.monotonic)
        self.writers_open: set[int] = set()   # heard from since it (or this process) last started
        self.pending_flushes: collections.deque[tuple[int, int, int, float]] = collections.deque()
        self.waiters: list[tuple[dict[int, int], asyncio.Future]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.bus = Bus(STORE, bus_endpoint, {Kind.LOG_FLUSHED: self.on_flushed, Kind.STORE_QUERY: self.on_query,
                                             Kind.STORE_PURGE: self.on_purge, Kind.STATS: self.on_stats,
                                             Kind.STORE_SUPERSEDED: self.on_superseded,
                                             Kind.STORE_FORGET: self.on_forget,
                                             Kind.STORE_CLOSED: self.on_closed,
                                             Kind.STORE_FORGET_CLOSED: self.on_forget_closed,
                                             Kind.PEER_RESTARTED: self.on_peer_restarted},
                       role="store", heartbeat_secs=config.broker.heartbeat_secs, log=log,
                       spill_bytes=config.broker.spill_ring_bytes)
        self.loaded_notices = LoadedNotices(self.bus, self.lag_ends, lambda: self.writers_open)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.loop.run_in_executor(self.queries, self.store.open)
        files = await self.loop.run_in_executor(self.queries, self.store.log_ends)
        # The loader reads no further than the writers say is durable: nothing until each answers
        # (`learn_ends`), then their notices and answers move it. The files' ends are not used: a
        # batch may be written there whose fdatasync has not returned, or will fail.
        self.flushed = {}
        self.store.limits = self.flushed
        self.loaded = dict(self.store.loaded)
        self.store.on_loaded = lambda positions, count: self.loop.call_soon_threadsafe(self._on_loaded, positions)
        self.fatal = asyncio.Event()
        self.store.on_fatal = lambda exc: self.loop.call_soon_threadsafe(self.fatal.set)
        if self.config.storage.s3.bucket:
            self.store.mend = bucket_mending.asker(self.bus, self.loop, self.log, self.store.stopping, self.config.logs)
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="store-loader")
        self.loader.submit(self.store.run_loader)
        behind = sum(max(files[w] - self.loaded.get(w, 0), 0) for w in files)
        self.log.info("DuckDB files in %s; resuming %d bytes behind the log", self.store.db_dir, behind)
        # What the log held before this start counts as lag too (no notice will tell of it): in
        # bytes and age from now; its records are not counted (that would mean reading them twice).
        self.files_at_start = dict(files)
        now = time.monotonic()
        for writer, end in sorted(files.items()):
            if end > self.loaded.get(writer, 0):
                self.pending_flushes.append((writer, end, 0, now))

    async def stop(self) -> None:
        """Stop the loader, then load what is left: on a clean stop DuckDB has the whole log."""
        self.store.stopping.set()
        self.loaded_notices.close()
        self.store.wake.set()
        self.store.urgent.set()
        self.loader.shutdown(wait=True)
        self.maintenance.shutdown(wait=True)   # a copy in progress reads the payload file: let it end
        self.passes.shutdown(wait=True)        # a pass's question in progress uses its cursors
        self.payload_reads.shutdown(wait=True)
        # Everything that writes records stopped before this process (the supervisor stops in
        # reverse order), each after its last fdatasync: the files are whole, whatever was noticed.
        self.store.limits = None
        await self.loop.run_in_executor(self.queries, self.store.load_all)
        self.queries.submit(self.store.close).result()
        self.queries.shutdown()

    # -- bus ------------------------------------------------------------------------------

    async def on_query(self, msg: Message) -> None:
        b = msg.body
        try:
            if b["query"] == "log_ends":   # where the logs end now (what a later `sync_to` may name)
                self.bus.reply(msg, Kind.STORE_ROWS, {"rows": sorted([w, p] for w, p in (await self.sync_target()).items())})
                return
            if b.get("sync_to") is not None:
                await self.caught_up(_positions(b["sync_to"]))
            elif b.get("sync"):
                await self.caught_up(await self.sync_target())
            if b["query"] == "blob_latest" and not self.store.has_blobs(str(b["session"])):
                # a new task's first read: answered here, not queued on the query thread behind
                # the reads of sessions that have checkpoints
                self.bus.reply(msg, Kind.STORE_ROWS, {"rows": []})
                return
            if b["query"] == "blob_latest" and (rows := await self._known_latest(str(b["session"]), b.get("tenant"))):
                self.bus.reply(msg, Kind.STORE_ROWS, {"rows": rows})
                return
            rows, next_after = await self.loop.run_in_executor(
                self.queries, lambda: self.store.query(b["query"], b["session"], b.get("tenant"), b.get("turn"),
                                                       int(b.get("after", -1) if b.get("after") is not None else -1),
                                                       int(b.get("limit") or 100), b.get("before"),
                                                       bool(b.get("desc")), b.get("flow"), b.get("status"),
                                                       b.get("at"), b.get("since"), b.get("until"),
                                                       {k: b[k] for k in RUN_MATCH if b.get(k) is not None}))
        except (asyncio.TimeoutError, BusError):
            self.bus.reply(msg, Kind.STORE_ROWS, {"rows": [], "error": "the store is too far behind the log"})
            return
        except ValueError as exc:
            self.bus.reply(msg, Kind.STORE_ROWS, {"rows": [], "error": str(exc)})
            return
        body = {"rows": rows}
        if next_after is not None:
            body["next_after"] = next_after
        self.bus.reply(msg, Kind.STORE_ROWS, body)

    async def _known_latest(self, session: str, tenant: str | None) -> list[dict]:
        """The session's newest external checkpoint if its place is known, read off the query
        thread; [] to ask the query thread instead. A payload compaction may have moved it and
        deleted its old segment since the place was looked up: that read fails (this process
        never numbers two segments alike) and the query thread answers."""
        if self.store.newest.get(session) is None:
            return []        # not known: no thread hop
        try:
            return await self.loop.run_in_executor(self.payload_reads, self.store.known_latest, session, tenant) or []
        except OSError:
            return []

    async def on_purge(self, msg: Message) -> None:
        runs = [str(r) for r in msg.body["runs"]]
        count = await self.loop.run_in_executor(self.passes, self.store.on_pass, self.store.purge_runs, runs)
        self.log.info("retention: removed %d rows of %d closed runs", count, len(runs))
        self.bus.reply(msg, Kind.STORE_ROWS, {"rows": [count]})

    async def on_superseded(self, msg: Message) -> None:
        b = msg.body
        await self._answer(msg, "superseded checkpoints", self.store.superseded_blobs,
                           int(b["writer"]), int(b["start"]), int(b["end"]))

    async def on_forget(self, msg: Message) -> None:
        b = msg.body   # on failure the rows stay; nothing reads them either way
        # the positions (tens of thousands) go to DuckDB as they are, off this loop: it checks them
        await self._answer(msg, "forgetting checkpoints", lambda *a: [self.store.forget_superseded(*a)],
                           int(b["writer"]), int(b["start"]), int(b["end"]), b["positions"])

    async def on_closed(self, msg: Message) -> None:
        await self._answer(msg, "records of closed sessions", self.store.closed_records,
                           int(msg.body["writer"]), int(msg.body["end"]))

    async def on_forget_closed(self, msg: Message) -> None:
        b = msg.body
        await self._answer(msg, "forgetting records of closed sessions", lambda *a: [self.store.forget_closed(*a)],
                           int(b["writer"]), int(b["start"]), int(b["end"]))

    async def _answer(self, msg: Message, what: str, call, *args) -> None:
        """Rows from `call(*args)` on the pass thread; DuckDB trouble is answered as an error
        (the asking compaction pass tries again later)."""
        try:
            rows = await self.loop.run_in_executor(self.passes, self.store.on_pass, call, *args)
        except Exception as exc:  # noqa: BLE001
            self.bus.reply(msg, Kind.STORE_ROWS, {"rows": [], "error": f"{what}: {exc}"})
            return
        self.bus.reply(msg, Kind.STORE_ROWS, {"rows": rows})

    def on_stats(self, msg: Message) -> None:
        records, seconds = self.lag()
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "store", "stats": {
            **self.store.stats, "lag_records": records, "lag_secs": round(seconds, 3), "lag_bytes": self.lag_bytes(),
            "loaded": {str(k): v for k, v in self.loaded.items()}, "flushed": {str(k): v for k, v in self.flushed.items()},
            "waiting_queries": len(self.waiters), "bus": self.bus.stats()}})

    async def recycle_files(self) -> None:
        """Reopen the DuckDB files (their one instance) once per `storage.duckdb_recycle_secs`."""
        period = self.config.storage.duckdb_recycle_secs
        if not period:
            return
        while True:
            await asyncio.sleep(period)
            try:
                await self.loop.run_in_executor(self.queries, self.store.recycle)
            except Exception:   # DuckDB trouble: the next round tries again
                self.log.exception("reopening the DuckDB files failed")

    async def compact_payloads(self) -> None:
        """Every `storage.compaction_interval_secs`, once they hold enough (`payload_compaction.threshold`):
        compact the payload segments worth it, for at most PAYLOAD_PASS_SECS (the next pass goes
        on where this one stopped)."""
        while True:
            await asyncio.sleep(self.config.storage.compaction_interval_secs)
            if self.store.payloads.total_bytes < payload_compaction.threshold(
                    self.config.storage.payload_compaction_min_mb, self.store.payloads.dir):
                continue
            deadline = time.monotonic() + PAYLOAD_PASS_SECS
            for segment in payload_compaction.order(self.store):
                if time.monotonic() > deadline:
                    break
                try:
                    plan = await self.loop.run_in_executor(self.maintenance, payload_compaction.copy_live,
                                                           self.store, segment)
                    if plan is None:
                        continue
                    freed = await self.loop.run_in_executor(self.queries, payload_compaction.swap, self.store, plan)
                except Exception as exc:   # never fatal: the segment stays in force, a later pass tries again
                    if write_failures.disk_full(exc):
                        self.log.warning("compaction: no room on the disk to rewrite payload segment %d (%s); the "
                                         "next pass tries again", segment, exc)
                    else:
                        self.log.exception("compacting payload segment %d failed", segment)
                    break
                metrics.payload_freed_bytes.inc(freed)
                self.log.info("compaction: payload segment %d rewritten, %d bytes of superseded checkpoints freed",
                              segment, freed)

    async def expire_access(self) -> None:
        """Every `storage.compaction_interval_secs`: access rows older than `storage.retention_secs`
        leave access.db (the logs' compaction drops their records likewise), and so do the rows of
        closes that are done (storage/session_closing.py)."""
        while True:
            await asyncio.sleep(self.config.storage.compaction_interval_secs)
            before = time.time() - self.config.storage.retention_secs
            try:
                count = await self.loop.run_in_executor(self.passes, self.store.on_pass, self.store.purge_access, before)
            except Exception:   # DuckDB trouble: the next pass tries again
                self.log.exception("removing expired access rows failed")
                continue
            if count:
                self.log.info("retention: removed %d access rows from before %.3f", count, before)
            try:
                await self.loop.run_in_executor(self.passes, self.store.on_pass, self.store.prune_closes)
            except Exception:   # the rows stay until a later pass; nothing reads them
                self.log.exception("pruning closed sessions failed")

    async def report(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            records, seconds = self.lag()
            metrics.store_lag_records.set(records)
            metrics.store_lag_seconds.set(seconds)
            metrics.store_lag_bytes.set(self.lag_bytes())
            self.loaded_notices.moved()   # also to a log restarted since, and when nothing loads
            metrics.message_store_queue.set(records)
            metrics.access_log_queue.set(records)
            metrics.payload_file_bytes.set(self.store.payloads.total_bytes)


def _positions(pairs: list) -> dict[int, int]:
    """`sync_to` as {log: position}; ValueError (answered as an error) if it is not [[int, int], ...]."""
    if not all(isinstance(p, list) and len(p) == 2 and all(type(v) is int and v >= 0 for v in p) for p in pairs):
        raise ValueError("sync_to must be a list of [log, position] pairs of non-negative integers")
    return {w: p for w, p in pairs}


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    # Less freed heap kept here: DuckDB's threads have an arena of their own, and a soak had this
    # process at 1.11× its warm-up with 8 MiB, 1.06× before (bench/results/2026-12-04-soak-*).
    native_memory.keep_freed_heap(native_memory.STORE_TRIM_THRESHOLD_BYTES)

    async def run(stop: asyncio.Event) -> int:
        service_ = StoreService(config, bus_address(config, run_dir), log)
        await service_.start()
        await service_.bus.start()
        learner = service.lifelong(service_.learn_ends())
        asker = service.lifelong(ask_quiet_logs(config.logs, service_.heard_at, service_.ask_quiet))
        reporter = service.lifelong(service_.report())
        recycler = service.lifelong(service_.recycle_files())
        compactor = service.lifelong(service_.compact_payloads())
        expirer = service.lifelong(service_.expire_access())
        fatal = asyncio.create_task(service_.fatal.wait())
        await asyncio.wait([asyncio.create_task(stop.wait()), fatal], return_when=asyncio.FIRST_COMPLETED)
        expirer.cancel()
        learner.cancel()
        asker.cancel()
        reporter.cancel()
        recycler.cancel()
        compactor.cancel()
        await service_.bus.close()
        if fatal.done():          # the supervisor starts it again, and a fresh open reads the files right
            return service.EXIT_FAILURE
        await service_.stop()
        return service.EXIT_OK

    return service.run(run)
