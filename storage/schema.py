"""The DuckDB files writer/store keeps, their tables, and which records feed which table.

Every table carries `writer` and `lsn` (the record's log and its position there), so rows can be
traced back to the log and paged in log order. The rows are also the progress: the largest `lsn`
of a log in a file is the last record of that log it loaded, committed in the same transaction
as the rows, so a restarted store resumes without losing or repeating a row (every record kind
projects at least one row into its file). Times are UNIX seconds (DOUBLE).

events.db
  events(session, tenant, turn, seq, type, data JSON text, ts, writer, lsn)
      turn lifecycle (turn.started, step.completed, turn.completed / failed / cancelled)
  session_summary(session, tenant, counted, first_at, last_at, chain_from)
      as in messages.db, of the events (`counted`: how many; `chain_from` NULL)
  jsonl_progress(path, bytes)
      with `storage.jsonl_dir` set: where events.jsonl ended after the last batch this file
      took, updated in that batch's transaction (storage/jsonl_events.py); one row at most
messages.db
  messages(session, tenant, idx, turn, role, content, extra JSON text, ts, writer, lsn)
      the transcript: message `idx` of a session (tool calls and ids in `extra`)
  checkpoints(session, tenant, kind, key, seq, is_full, first_idx, payload, ts, writer, lsn,
              payload_at, payload_len)
      kind 'agent': an agent session's state (payload = msgpack list of messages, starting at
      message index `first_idx`; `is_full` marks a complete snapshot); kind 'blob': an external
      runtime's checkpoint under `key` (payload = its bytes). The payload itself lives in the
      payload segments (storage/payload_segments.py): `payload_at` is a place (segment << 40 |
      offset), `payload_len` its length; the `payload` column is NULL except in rows written
      before those files existed. Only the newest 'blob' row of a session in each load batch has
      its payload copied there (nothing reads an older one); the others have `payload`,
      `payload_at` and `payload_len` NULL. A payload compaction (storage/payload_compaction.py)
      moves a segment's live payloads to another and NULLs those columns of its other rows.
      Once the log's compaction has dropped a superseded 'blob' record, its row goes too
      (`StoreDeletions.forget_superseded`, storage/store_deletions.py).
  session_summary(session, tenant, counted, first_at, last_at, chain_from)
      a row per session with rows here: its message count (`counted`), the time of its first
      and last messages or checkpoints row, and where its checkpoint chain starts (the smallest
      time from its newest full agent checkpoint on; NULL: not known), merged about once a second
      (storage/session_summary.py; it bounds the session's reads, and a close's deletions, to
      the row groups of its life)
  payload_file(generation)
      older versions only: which single file held the payloads (messages.payloads, or
      messages.payloads.<n>); it becomes payload segment 0 when the store opens
  closed_sessions(session, tenant, upto JSON text, ts, applied, writer, lsn)
      a session closed (DELETE /v1/sessions/{sid}): its rows before `upto` ({log: position}) are
      deleted; `applied` once they are (storage/session_closing.py)
  closed_records(session, log, position)
      where the log still holds records of closed sessions, until its compaction drops them
  Rows whose session is '' only keep a log's progress in their file, after the rows they replace
  were deleted (their type, role or kind is 'progress').
access.db
  access(ts, method, route, status, tenant, session, duration_ms, writer, lsn)
flows.db
  flow_records(run, tenant, type, seq, body, ts, writer, lsn, name, parent, extra)
      the journals of flow runs (body = the whole msgpack record; see actors/flow_state.py);
      `name` is a start's flow and an end's status, `parent` a child's start's parent, `extra`
      a start's queue, queue_key, priority, start_at, schedule and forked_from as JSON (if
      any), so that a listing of runs reads no body (NULL in rows loaded before 2026-12-06,
      `extra` before its evening, and in the rest)
Every file
  loader_version(version)
      the writer/store that created the file empty (storage/loader_version.py); none in a file
      an older one loaded, whose log reader could skip records
"""
from __future__ import annotations

from storage.records import RecordKind

DATABASES: dict[str, list[str]] = {
    "events": [
        "CREATE TABLE IF NOT EXISTS events (session VARCHAR, tenant VARCHAR, turn VARCHAR, seq INTEGER, "
        "type VARCHAR, data VARCHAR, ts DOUBLE, writer SMALLINT, lsn BIGINT)",
        "CREATE TABLE IF NOT EXISTS jsonl_progress (path VARCHAR, bytes BIGINT)",
    ],
    "messages": [
        "CREATE TABLE IF NOT EXISTS messages (session VARCHAR, tenant VARCHAR, idx INTEGER, turn VARCHAR, "
        "role VARCHAR, content VARCHAR, extra VARCHAR, ts DOUBLE, writer SMALLINT, lsn BIGINT)",
        "CREATE TABLE IF NOT EXISTS checkpoints (session VARCHAR, tenant VARCHAR, kind VARCHAR, key VARCHAR, "
        "seq BIGINT, is_full BOOLEAN, first_idx INTEGER, payload BLOB, ts DOUBLE, writer SMALLINT, lsn BIGINT, "
        "payload_at BIGINT, payload_len INTEGER)",
        # files made before payloads moved out of DuckDB: the same columns, at the same places
        "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS payload_at BIGINT",
        "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS payload_len INTEGER",
        "CREATE TABLE IF NOT EXISTS payload_file (generation BIGINT)",
        "CREATE TABLE IF NOT EXISTS closed_sessions (session VARCHAR, tenant VARCHAR, upto VARCHAR, ts DOUBLE, "
        "applied BOOLEAN, writer SMALLINT, lsn BIGINT)",
        "CREATE TABLE IF NOT EXISTS closed_records (session VARCHAR, log SMALLINT, position BIGINT)",
    ],
    "flows": [
        "CREATE TABLE IF NOT EXISTS flow_records (run VARCHAR, tenant VARCHAR, type VARCHAR, seq INTEGER, "
        "body BLOB, ts DOUBLE, writer SMALLINT, lsn BIGINT, name VARCHAR, parent VARCHAR, extra VARCHAR)",
        # files made before runs were listed: the same columns, at the same places (NULLs)
        "ALTER TABLE flow_records ADD COLUMN IF NOT EXISTS name VARCHAR",
        "ALTER TABLE flow_records ADD COLUMN IF NOT EXISTS parent VARCHAR",
        "ALTER TABLE flow_records ADD COLUMN IF NOT EXISTS extra VARCHAR",
    ],
    "access": [
        "CREATE TABLE IF NOT EXISTS access (ts DOUBLE, method VARCHAR, route VARCHAR, status INTEGER, "
        "tenant VARCHAR, session VARCHAR, duration_ms DOUBLE, writer SMALLINT, lsn BIGINT)",
    ],
}

TABLE_DB = {"events": "events", "messages": "messages", "checkpoints": "messages", "access": "access",
            "flow_records": "flows", "closed_sessions": "messages"}
# Tables the loader also appends to whose rows say nothing of its progress (no writer, lsn).
BOOK_TABLE_DB = {"closed_records": "messages"}
KIND_DB = {RecordKind.EVENT: "events", RecordKind.CHECKPOINT: "messages", RecordKind.BLOB: "messages",
           RecordKind.ACCESS: "access", RecordKind.FLOW: "flows", RecordKind.CLOSE: "messages"}
