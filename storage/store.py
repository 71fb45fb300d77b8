"""The DuckDB projection of the log: a loader that tails the segments, and the read queries.

The loader (its own thread) reads whole records from every log, turns them into rows and loads
them with DuckDB's appender in one transaction per file, together with that file's progress.
Under overload it falls behind; it never drops. Queries (storage/store_queries.py) run on a
separate thread with their own cursors, so a slow query never stops loading; compaction's and
retention's questions and deletions run on a third with cursors of their own (`on_pass`), so a
pass's half-second question never stops a read. Only this process imports DuckDB. The four
files share one DuckDB instance (storage/duck_files.py).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import duckdb

from agentos import metrics, native_memory
from storage import (compaction_reserve, duck_files, loader_version, payload_segments, records, schema, segments,
                     session_closing, session_summary)
from storage.bloom import BloomFilter
from storage.duck_memory import MemoryLimit
from storage.free_space import LoadFloor
from storage.jsonl_events import JsonlEvents
from storage.newest_blobs import NewestBlobs
from storage.payload_segments import PayloadSegments
from storage.projection import project
from storage.session_closing import SessionClosing
from storage.session_summary import SessionSummaries
from storage.store_deletions import StoreDeletions
from storage.store_queries import StoreQueries
from storage.write_failures import LoadFailures

READ_BYTES = 8 << 20          # per log and batch, at most; halved after a batch DuckDB could not take
MIN_READ_BYTES = 256 << 10
PAYLOAD_COLUMN = 7            # of a checkpoints row as projected: its bytes go to the payload file
# Bulk loading: a batch is loaded once this much time passed since the previous one, unless a
# reader is waiting for it (`urgent`). Each load costs three DuckDB transactions whatever its size.
BATCH_INTERVAL_SECS = 1.0
LOAD_RETRY_SECS = 1.0           # a batch that failed is tried again after this long…
SMALLER_RETRY_SECS = 0.1        # …or this, when the next one is smaller (down to MIN_READ_BYTES)
MIN_DB_MEMORY_MB = 16          # per file: the instance gets at least this for each
BIG_RECORD_BYTES = 512 << 10   # past this a value takes blocks of its own size in DuckDB
OPEN_ROWS_PER_FETCH = 10_000


class Store(StoreQueries, SessionClosing, StoreDeletions, SessionSummaries):
    def __init__(self, data_dir: Path, writers: int, memory_limit_mb: int, jsonl_dir: str = "",
                 log: logging.Logger | None = None,
                 payload_segment_bytes: int = payload_segments.SEGMENT_BYTES, min_free_bytes: int = 0) -> None:
        self.db_dir = data_dir / "db"
        self.wal_root = data_dir / "wal"
        self.writers = writers
        self.memory_limit_mb = memory_limit_mb
        # raised for big values; one limit, the instance's, whichever file's statement raises it
        self.memory = dict.fromkeys(schema.DATABASES, MemoryLimit(self.instance_memory_mb))
        self.instance: duckdb.DuckDBPyConnection | None = None
        self.log = log or logging.getLogger("agent-os.writer/store")
        self.jsonl = JsonlEvents(Path(jsonl_dir), self.log) if jsonl_dir else None
        self.conns: dict[str, duckdb.DuckDBPyConnection] = {}          # the loader's, and setup's
        self.cursors: dict[str, duckdb.DuckDBPyConnection] = {}        # the query thread's
        self.pass_cursors: dict[str, duckdb.DuckDBPyConnection] = {}   # the pass thread's (`on_pass`)
        self.progress: dict[str, dict[int, int]] = {}
        self.loaded: dict[int, int] = {}
        self.readers: dict[int, segments.SegmentReader] = {}
        # How far each log is durable, as its writer reported (writer/store sets this): records past
        # it may be in the files but not on the disk yet. None: read to the files' ends (tools, tests).
        self.limits: dict[int, int] | None = None
        self.wake = threading.Event()
        self.urgent = threading.Event()
        self.stopping = threading.Event()
        self.on_loaded: Callable[[dict[int, int], int], None] = lambda positions, rows: None
        self.on_fatal: Callable[[BaseException], None] = lambda exc: None
        # (log, position) -> True once that log's writer mended the damage there from the bucket
        # (storage/bucket_mending.py `asker`)
        self.mend: Callable[[int, int], bool | None] = lambda writer, position: False
        self.stats = {"records": 0, "rows": 0, "batches": 0, "bad_records": 0, "load_errors": 0}
        self.load_failures = LoadFailures(self.log)
        self.backlog = False
        self.loading = threading.Lock()   # held while a batch loads; a recycle waits for it
        self.passing = threading.Lock()   # held while a pass's question runs; a recycle waits for it
        self.payloads = PayloadSegments(self.db_dir / payload_segments.DIR_NAME, payload_segment_bytes)
        self.payloads.loader.floor = LoadFloor(self.db_dir, self.wal_root, min_free_bytes, payload_segment_bytes).check
        self.payload_cursor = -1      # the payload segment a compaction pass looked at last
        self.read_bytes = READ_BYTES
        # "kind:session" of every checkpoint loaded: a session not in it has none (storage/bloom.py)
        self.checkpointed = BloomFilter()
        self.newest = NewestBlobs()   # where each session's newest external checkpoint lies
        self.closing: dict[str, dict[int, int]] = {}   # see storage/session_closing.py
        self.pending_closes: list[tuple[str, dict[int, int], int, int]] = []
        self.summary_pending = {db: session_summary.Pending(db) for db in session_summary.SOURCES}
        self.summary_merged = time.monotonic()

    # -- opening --------------------------------------------------------------------------

    def open(self) -> None:
        self.db_dir.mkdir(parents=True, exist_ok=True)
        last: dict[str, dict[int, int]] = {}
        self._open_instance()
        for db, ddls in schema.DATABASES.items():
            con = self.conns[db]
            for ddl in ddls:
                con.execute(ddl)
            last[db] = {}
            for table, table_db in schema.TABLE_DB.items():
                if table_db == db:
                    for writer, lsn in con.execute(f"SELECT writer, max(lsn) FROM {table} GROUP BY writer").fetchall():
                        last[db][writer] = max(last[db].get(writer, -1), lsn)
            # Records before this position are in the file (the one at `lsn` itself included).
            self.progress[db] = {w: lsn + 1 for w, lsn in last[db].items()}
            loader_version.check(con, db, bool(last[db]), self.log)
            if db in session_summary.SOURCES:
                with self.memory[db].raised(con):   # in a file from before it: an aggregate of every session
                    built, merged = session_summary.open_summary(con, db, self.progress[db])
                if merged:
                    self.log.info("%s.db: session summary %s: %d sessions", db,
                                  "built from the rows" if built else "caught up with the rows", merged)
        if self.jsonl is not None:
            self.jsonl.open_with(self.conns["events"])
        # in pieces: a million sessions' names at once would hold a few hundred MB for a moment
        result = self.conns["messages"].execute("SELECT DISTINCT kind, session FROM checkpoints")
        while rows := result.fetchmany(OPEN_ROWS_PER_FETCH):
            for kind, session in rows:
                self.checkpointed.add(f"{kind}:{session}")
        # Where each payload segment's last committed row ends (a segment no row names is garbage).
        ends = self.conns["messages"].execute(
            f"SELECT payload_at >> {payload_segments.SHIFT}, max(payload_at + payload_len) FROM checkpoints "
            "WHERE payload_at IS NOT NULL GROUP BY 1").fetchall()
        committed = {n: end - payload_segments.place(n, 0) for n, end in ends}
        for note in self.payloads.open(committed, self._legacy_payloads()):
            (self.log.error if note.startswith("ERROR") else self.log.info)("%s", note)
        # A log that an earlier configuration wrote (more writers, or the gateway's own) is still loaded.
        if self.wal_root.is_dir():
            self.writers = max([self.writers, *(int(p.name) + 1 for p in self.wal_root.iterdir() if p.name.isdigit())])
        for writer in range(self.writers):
            start = min(last[db].get(writer, 0) for db in self.conns)
            self.readers[writer] = segments.SegmentReader(self.wal_root / str(writer), start,
                                                          lambda position, w=writer: self.mend(w, position))
            self.loaded[writer] = start
        self.pending_closes = self.open_closing()   # a crash cut their deletions short
        self.apply_pending_closes()

    def _legacy_payloads(self) -> Path:
        """The single payload file of older versions (`payload_file` named its generation)."""
        (generation,) = self.conns["messages"].execute(
            "SELECT coalesce(max(generation), 0) FROM payload_file").fetchone()
        name = payload_segments.LEGACY_NAME + (f".{generation}" if generation else "")
        for path in self.db_dir.glob(payload_segments.LEGACY_NAME + "*"):
            if path.name != name:
                path.unlink()
        return self.db_dir / name

    def _open_instance(self) -> None:
        self.instance = duck_files.open_files(self.db_dir, self.instance_memory_mb,
                                              self.conns, self.cursors, self.pass_cursors)

    def _close_instance(self) -> None:
        instance, self.instance = self.instance, None
        duck_files.close_files(instance, self.conns, self.cursors, self.pass_cursors)

    def recycle(self) -> None:
        """Close and reopen the DuckDB instance. DuckDB's native memory creeps under a steady
        insert load (caches, allocator pools) beyond what `memory_limit` accounts for; a reopen
        starts it over. Runs on the query thread (no query is running) holding the pass thread's
        lock, then the loader's (nor is a pass's question, nor a load); the CHECKPOINTs make the
        reopen quick."""
        with self.passing, self.loading:
            try:
                for con in self.conns.values():
                    con.execute("CHECKPOINT")
            finally:
                self._close_instance()
                self._open_instance()
        self.stats["reopened"] = self.stats.get("reopened", 0) + 1
        native_memory.release_free_memory()

    def log_ends(self) -> dict[int, int]:
        """Where each log ends on disk right now."""
        ends = {}
        for writer in range(self.writers):
            reader = self.readers.get(writer)
            ends[writer] = segments.log_end(self.wal_root / str(writer), reader.position if reader else 0)
        return ends

    def close(self) -> None:
        if self.conns:
            self.merge_before_close()
        self._close_instance()
        self.payloads.close()

    # -- loading --------------------------------------------------------------------------

    def run_loader(self) -> None:
        last = 0.0
        while not self.stopping.is_set():
            # Wait for news (writers announce every batch; the timeout covers a lost notice), then
            # let a bulk batch build up unless someone is waiting to read.
            self.wake.wait(0.5)
            self.wake.clear()
            pause = BATCH_INTERVAL_SECS - (time.monotonic() - last)
            if pause > 0 and not self.urgent.is_set():
                self.urgent.wait(pause)
            self.urgent.clear()
            last = time.monotonic()
            before = self.read_bytes
            try:
                # Keep loading without a pause only while a backlog remains (reads came back full).
                while self.load_once() >= 0 and self.backlog and not self.stopping.is_set():
                    pass
                self.load_failures.succeeded()
            except duckdb.FatalException as exc:
                # DuckDB invalidated the file (an autocheckpoint that failed after a durable
                # COMMIT, say): nothing more loads until it is reopened, and only a fresh open
                # reads its progress right (that commit's rows are in it). Crash-only: the
                # process restarts; the log still holds every record.
                self.stats["load_errors"] += 1
                self.log.error("DuckDB invalidated a file; writer/store restarts to reopen it: %s",
                               " ".join(str(exc).split())[:300])
                self.on_fatal(exc)
                return
            except Exception as exc:  # DuckDB trouble (a full disk, say): keep the position, try again shortly
                self.stats["load_errors"] += 1
                self.load_failures.failed(exc)
                compaction_reserve.release_to_store(self.wal_root, self.db_dir, exc, self.log)
                self.wake.set()
                smaller = self.read_bytes < before   # then soon: a full disk's room may take it
                if smaller:
                    self.urgent.set()
                self.stopping.wait(SMALLER_RETRY_SECS if smaller else LOAD_RETRY_SECS)

    def load_all(self) -> None:
        while self.load_once():
            pass

    def load_once(self) -> int:
        with self.loading:
            count = self._load_once()
            self.merge_summaries()
            return count

    def _load_once(self) -> int:
        rows: dict[str, list[tuple]] = {}
        positions: dict[str, dict[int, int]] = {db: {} for db in self.conns}
        scanned: dict[int, int] = {}
        starts = {w: r.position for w, r in self.readers.items()}
        events_for_jsonl: list[dict] = []
        big: set[str] = set()     # files a record of this batch brings a big value to
        first_blobs: set[str] = set()   # sessions whose first external checkpoint this batch loads
        count = 0
        self.backlog = False
        payloads_mark = self.payloads.loader.mark()
        for writer, reader in self.readers.items():
            damaged, mended = reader.damaged, reader.mended
            batch = reader.read(self.read_bytes, None if self.limits is None else self.limits.get(writer, 0))
            if batch and batch[-1][4] - batch[0][0] > self.read_bytes // 2:
                self.backlog = True
            for position, kind, _, body, nxt in batch:
                db = schema.KIND_DB.get(kind)
                count += 1
                if len(body) > BIG_RECORD_BYTES and kind != records.RecordKind.BLOB:   # blobs go to payloads
                    big.add(db)
                if db is None or position < self.progress[db].get(writer, 0):
                    continue  # loaded before a restart
                try:
                    decoded = records.decode_body(body)
                    if self.closing and (closed := self.closed_before(kind, decoded, writer, position)):
                        rows.setdefault("closed_records", []).append((closed, writer, position))
                        positions[db][writer] = position + 1
                        continue
                    for table, row in list(project(kind, decoded, writer, position)):  # all or nothing
                        if table == "checkpoints":
                            # before the commit: a query can only see the row once this is set
                            if self.checkpointed.add(f"{row[2]}:{row[0]}") and row[2] == "blob":
                                first_blobs.add(row[0])
                        rows.setdefault(table, []).append(row)
                except Exception as exc:  # noqa: BLE001 — whatever one record's projection raises is that record's
                    self.stats["bad_records"] += 1
                    self.log.error("skipping an unreadable record at %d:%d: %s", writer, position, exc)
                    continue
                positions[db][writer] = position + 1
                if self.jsonl is not None and kind == records.RecordKind.EVENT:
                    events_for_jsonl.append(decoded)
            if batch:
                scanned[writer] = batch[-1][4]
            if reader.mended != mended:     # its next read takes the mended records
                self.backlog = True
            if reader.damaged != damaged:   # it passed a damaged stretch: loaded up to where it goes on
                self.stats["bad_records"] += reader.damaged - damaged
                metrics.log_damaged.labels("skipped").inc(reader.damaged - damaged)
                scanned[writer] = reader.position
        if not scanned:
            return 0
        started = time.monotonic()
        try:
            # In the try: a full disk met copying the payloads leaves the batch to load again too.
            if "checkpoints" in rows:
                rows["checkpoints"] = self._payloads_out(rows["checkpoints"])
            for db, pending in self.summary_pending.items():
                pending.stage(rows)   # before the commit: a reader may see the rows as soon as it is done
            self.payloads.loader.sync()   # before the rows that point into it commit
            for db in self.conns:
                tables = {t: r for t, r in rows.items() if schema.TABLE_DB.get(t, schema.BOOK_TABLE_DB.get(t)) == db}
                if tables or positions[db]:
                    self._commit_with_jsonl(db, tables, positions[db], db in big, events_for_jsonl)
                    if db in self.summary_pending:
                        self.summary_pending[db].committed()
                    if db == "messages":   # at once: a retry after another file's failure skips these rows
                        self._note_newest(rows.get("checkpoints", ()), first_blobs)
        except Exception as exc:
            for pending in self.summary_pending.values():
                pending.discard()   # its file did not take the batch (those that did kept theirs)
            for writer, start in starts.items():
                self.readers[writer].position = start  # re-read; files already committed skip by progress
            # Not after a fatal one: it may follow a durable COMMIT, and the process restarts
            # (`open` keeps what committed rows name and cuts the rest off).
            if not self._committed(positions["messages"]) and not isinstance(exc, duckdb.FatalException):
                self.payloads.loader.rewind(payloads_mark)
            # DuckDB may have refused the batch for want of memory: try a smaller one next time
            self.read_bytes = max(MIN_READ_BYTES, self.read_bytes // 2)
            raise
        self.read_bytes = min(READ_BYTES, self.read_bytes * 2)
        self.loaded.update(scanned)
        for session, tenant, upto, _, _, writer, lsn in rows.get("closed_sessions", ()):
            ends = session_closing.parse_upto(upto)
            self.expect_close(session, ends)
            self.pending_closes.append((session, ends, writer, lsn))
        if self.pending_closes:
            self.apply_pending_closes()
        self.settle_closing()
        total_rows = sum(len(r) for r in rows.values())
        for table, table_rows in rows.items():
            metrics.store_rows.labels(table).inc(len(table_rows))
        metrics.store_batch_ms.observe((time.monotonic() - started) * 1000.0)
        self.stats["records"] += count
        self.stats["rows"] += total_rows
        self.stats["batches"] += 1
        self.on_loaded(dict(self.loaded), count)
        return count

    def _note_newest(self, rows: list[tuple], first_blobs: set[str]) -> None:
        loaded = self.newest.loaded
        for row in rows:
            if row[2] == "blob" and row[11] is not None:   # a session's newest of the batch
                loaded(row, row[0] in first_blobs)

    def _payloads_out(self, rows: list[tuple]) -> list[tuple]:
        """A batch's checkpoints rows with their payloads moved to the payload file.

        An external runtime's checkpoints (kind 'blob') are only ever read as a session's newest
        (`blob_latest`), so of a session's blob rows in one batch only the newest keeps its
        payload; the others keep their row with the payload columns NULL (the log still holds
        their bytes). An agent runtime that checkpoints every step writes many per second per
        session: at 10k checkpoints of 500 sessions most never reach the file."""
        newest: dict[str, int] = {}
        for row in rows:
            if row[2] == "blob" and row[4] > newest.get(row[0], -1):
                newest[row[0]] = row[4]
        return [row[:PAYLOAD_COLUMN] + (None,) + row[PAYLOAD_COLUMN + 1:] + (None, None)
                if row[2] == "blob" and row[4] != newest[row[0]] else self._payload_out(row) for row in rows]

    def _payload_out(self, row: tuple) -> tuple:
        """A checkpoints row with its payload moved to the payload file: (…, NULL, …, at, len)."""
        at, length = self.payloads.loader.append(row[PAYLOAD_COLUMN])
        return row[:PAYLOAD_COLUMN] + (None,) + row[PAYLOAD_COLUMN + 1:] + (at, length)

    def _committed(self, positions: dict[int, int]) -> bool:
        """Whether messages.db took this batch (its progress reached every position in it)."""
        return all(self.progress["messages"].get(w, 0) >= p for w, p in positions.items())

    @property
    def instance_memory_mb(self) -> int:
        return max(MIN_DB_MEMORY_MB * len(schema.DATABASES), self.memory_limit_mb)

    def _commit_with_jsonl(self, db: str, tables: dict[str, list[tuple]], positions: dict[int, int], big: bool,
                           events: list[dict]) -> None:
        """`_commit`, with the batch's event lines in the JSONL copy first (storage/jsonl_events.py)."""
        if db != "events" or not events or self.jsonl is None:
            self._commit(db, tables, positions, big)
        else:
            self.jsonl.write_then(events, lambda statement: self._commit(db, tables, positions, big, statement))

    def _commit(self, db: str, tables: dict[str, list[tuple]], positions: dict[int, int], big: bool,
                statement: tuple[str, list] | None = None) -> None:
        if big:   # raised up front: the COMMIT's autocheckpoint pins the value's block too, and its
            # failure is fatal to the file, not an error to retry (storage/duck_memory.py)
            with self.memory[db].raised(self.conns[db]):
                self._append(db, tables, statement)
        else:
            self.memory[db].run(self.conns[db], lambda: self._append(db, tables, statement))
        self.progress[db].update(positions)

    def _append(self, db: str, tables: dict[str, list[tuple]], statement: tuple[str, list] | None = None) -> None:
        duck_files.append_rows(self.conns[db], tables, statement)   # (where the tests fail a batch)
