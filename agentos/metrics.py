"""Every Prometheus metric of the process tree, declared once.

prometheus-client's multiprocess mode: each process writes its values to memory-mapped files in
PROMETHEUS_MULTIPROC_DIR (set by the supervisor before any child starts), and the gateway's
/metrics sums them. Counters of a process that died stay in the sum, so totals survive restarts
(folded into one file per type, agentos/metrics_files.py); its live gauges are removed.

Hot paths never touch these per message: they count in plain ints and flush here about once a
second (see `Flusher`).
"""
from __future__ import annotations

import bisect
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agentos import metrics_files

# Buckets in milliseconds that resolve both 1 ms and 10 s.
MS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000,
              7500, 10000, 15000, 20000, 30000, 60000, 120000)

in_flight_turns = Gauge("agentos_in_flight_turns", "Turns accepted by the gateway and not yet ended",
                        multiprocess_mode="livesum")
admission_limit = Gauge("agentos_admission_limit", "kernel.max_in_flight_turns (0 = gate off)",
                        multiprocess_mode="livemax")
admission_rejected = Counter("agentos_admission_rejected_total", "Turns answered 429 by the admission gate")
draining = Gauge("agentos_draining", "1 while the gateway drains before shutdown", multiprocess_mode="livemax")
http_requests = Counter("agentos_http_requests_total", "HTTP requests by route and status", ["route", "status"])

active_sessions = Gauge("agentos_active_sessions", "Sessions resident in actor memory",
                        multiprocess_mode="livesum")
active_processes = Gauge("agentos_active_processes", "Turns and flows running in actors",
                         multiprocess_mode="livesum")
turns = Counter("agentos_turns_total", "Turns ended, by outcome", ["outcome"])
turn_duration = Histogram("agentos_turn_duration_ms", "Whole turn time in the actor, ms", buckets=MS_BUCKETS)
turn_ttft = Histogram("agentos_turn_ttft_ms", "Time from turn start to its first token, ms", buckets=MS_BUCKETS)
tokens_prompt = Counter("agentos_tokens_prompt_total", "Prompt tokens reported by the provider")
tokens_completion = Counter("agentos_tokens_completion_total", "Completion tokens reported by the provider")
provider_errors = Counter("agentos_provider_errors_total", "Provider call failures by kind", ["kind"])
evicted_sessions = Counter("agentos_sessions_evicted_total", "Sessions evicted from memory after their TTL")
flow_runs_started = Counter("agentos_flow_runs_started_total", "Flow runs started (forks and children too), by flow",
                            ["flow"])
flow_runs_ended = Counter("agentos_flow_runs_ended_total", "Flow runs ended, by flow and status", ["flow", "status"])
flow_steps = Counter("agentos_flow_steps_total", "Flow steps' attempts, by outcome: completed, failed (the last "
                     "attempt), retried (another attempt follows), interrupted (its worker stopped cleanly "
                     "mid-attempt; not counted against its retries)", ["outcome"])
flow_ops = Counter("agentos_flow_ops_total", "Flow runs' other operations done, by op: sleep, wait (a message "
                   "taken or its timeout), child, attr_set, patch, send, publish, emit", ["op"])
flow_runs_open = Gauge("agentos_flow_runs_open", "Flow runs started and not ended, in their actors' memory",
                       multiprocess_mode="livesum")
schedule_starts = Counter("agentos_schedule_starts_total",
                          "Times of schedules started, by outcome: started (its run made), repeated (its run was "
                          "there: a start sent again), refused (its id names another run), given_up (no actor "
                          "took it within its catch-up)", ["outcome"])
flow_queue_running = Gauge("agentos_flow_queue_running", "Runs of a flow queue admitted and not ended, by queue",
                           ["queue"], multiprocess_mode="livesum")
flow_queue_waiting = Gauge("agentos_flow_queue_waiting", "Runs enqueued in a flow queue waiting for a place, by "
                           "queue", ["queue"], multiprocess_mode="livesum")

workers = Gauge("agentos_workers", "Workers connected, by state: serving, draining (`agent-os worker --drain`)",
                ["state"], multiprocess_mode="livesum")
worker_slots = Gauge("agentos_worker_slots", "Task slots of the serving workers, by state: busy, free",
                     ["state"], multiprocess_mode="livesum")
tasks_waiting = Gauge("agentos_tasks_waiting", "Tasks waiting for a worker with a free slot that has them, by kind: "
                      "flow (a run's execution), tool, update", ["kind"], multiprocess_mode="livesum")

permits_in_use = Gauge("agentos_permits_in_use", "Provider permits held", multiprocess_mode="livesum")
permit_queue = Gauge("agentos_permit_queue", "Model calls waiting for a provider permit",
                     multiprocess_mode="livesum")
permit_wait = Histogram("agentos_permit_wait_ms", "Time from permit request to grant, ms", buckets=MS_BUCKETS)
provider_backoffs = Counter("agentos_provider_backoffs_total", "Times the scheduler paused grants after a provider 429")

bus_messages = Counter("agentos_bus_messages_total", "Messages routed by the broker, by kind", ["kind"])
bus_undeliverable = Counter("agentos_bus_undeliverable_total", "Messages the broker could not deliver", ["reason"])
bus_malformed = Counter("agentos_bus_malformed_total", "Malformed messages counted and dropped, by role", ["role"])
bus_retries = Counter("agentos_bus_retries_total", "Bus requests re-sent after a timeout or an undeliverable reply",
                      ["role"])
bus_big_bodies = Counter("agentos_bus_big_bodies_total", "Message bodies of 16 KiB or more sent, by role and path: "
                         "ring (the sender's shared-memory ring, broker/spill.py) or broker (whole through it: the "
                         "ring full, off, or not to be had)", ["role", "path"])

log_records = Counter("agentos_log_records_total", "Records appended to the write-ahead log")
log_duplicates = Counter("agentos_log_duplicates_total", "Re-sent records the log already had (written once)")
log_bytes = Counter("agentos_log_bytes_total", "Bytes appended to the write-ahead log")
log_fsyncs = Counter("agentos_log_fsyncs_total", "fdatasync calls of the write-ahead log (one per batch)")
log_fsync_ms = Histogram("agentos_log_fsync_ms", "Write plus fdatasync of one batch, ms", buckets=MS_BUCKETS)
log_segments_zeroed = Counter(
    "agentos_log_segments_zeroed_total",
    "Log segments zeroed before use (storage/spares.py), by when: ahead (the next one, while the log filled the one "
    "before), idle (a further spare while the log was idle), at_rotation (none ready: a batch waited for it), "
    "at_open (a log's first segment)",
    ["when"])
log_batch_records = Histogram("agentos_log_batch_records", "Records per group-commit batch",
                              buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384))
log_write_errors = Counter("agentos_log_write_errors_total", "Failed log writes (e.g. a full disk)")
log_damaged = Counter("agentos_log_damaged_records_total", "Damaged records met in the log (bytes that are not whole "
                      "records where whole ones must be), by what became of them: mended (the bucket's copy written "
                      "over them), skipped (writer/store passed over them), kept (a compaction left the segment as it "
                      "was), restored (a batch object read back damaged from the bucket, written as it was)",
                      ["outcome"])
disk_free_bytes = Gauge("agentos_disk_free_bytes", "Free bytes on the filesystems the tree writes to, read at each "
                        "scrape: volume data (storage.dir: DuckDB) and wal (storage.dir/wal: the logs, the same "
                        "filesystem unless one is mounted there); below agentos_logs_min_free_bytes on wal, "
                        "durable writes answer 507", ["volume"], multiprocess_mode="livemax")
logs_min_free_bytes = Gauge("agentos_logs_min_free_bytes", "Free bytes below which the logs take no appends "
                            "(storage.min_free_bytes, as it comes to on the logs' volume; 0: off)",
                            multiprocess_mode="livemax")
compaction_reserve_bytes = Gauge("agentos_compaction_reserve_bytes", "Room a log keeps for a compaction's rewrite on a "
                                 "full disk (0: spent, or the disk has had no room for it)", ["log"],
                                 multiprocess_mode="livemax")
log_append_wait = Histogram("agentos_log_append_wait_ms", "Time a SYNC record waited for its ack, ms",
                            buckets=MS_BUCKETS)

event_db_write_wait = Histogram("agentos_event_db_write_wait_ms", "Time a record waited in the log before the "
                                "store loaded it into DuckDB, ms", buckets=MS_BUCKETS)
message_store_queue = Gauge("agentos_message_store_queue", "Transcript and checkpoint records in the log not yet "
                            "in messages.db", multiprocess_mode="livesum")
access_log_queue = Gauge("agentos_access_log_queue", "Access rows in the log not yet in access.db",
                         multiprocess_mode="livesum")
event_db_dropped = Counter("agentos_event_db_dropped_total", "Events dropped by the store (stays 0: it lags "
                           "instead)")
store_lag_records = Gauge("agentos_store_lag_records", "Records the store is behind the log",
                          multiprocess_mode="livesum")
store_lag_bytes = Gauge("agentos_store_lag_bytes", "Bytes of the log the store has not loaded (a restart's "
                        "backlog included)", multiprocess_mode="livesum")
store_lag_seconds = Gauge("agentos_store_lag_seconds", "Age of the oldest record the store has not loaded",
                          multiprocess_mode="livemax")
store_rows = Counter("agentos_store_rows_total", "Rows loaded into DuckDB, by table", ["table"])
store_batch_ms = Histogram("agentos_store_batch_ms", "Time to load one batch into DuckDB, ms", buckets=MS_BUCKETS)
compacted_records = Counter("agentos_compacted_records_total", "Records compaction removed from the log, by reason "
                            "(superseded_checkpoint, closed_run, expired_access, closed_session)", ["reason"])
payload_file_bytes = Gauge("agentos_payload_file_bytes", "Bytes in writer/store's checkpoint payload segments",
                           multiprocess_mode="livesum")
payload_freed_bytes = Counter("agentos_payload_freed_bytes_total", "Bytes of superseded checkpoints a payload "
                              "compaction freed")

s3_requests = Counter("agentos_s3_requests_total", "Object storage requests, by operation and purpose",
                      ["op", "purpose"])
s3_put_ms = Histogram("agentos_s3_put_ms", "Latency of a log batch PUT, ms", buckets=MS_BUCKETS)
s3_bytes = Counter("agentos_s3_bytes_total", "Log bytes shipped to object storage")
s3_batches_per_put = Histogram("agentos_s3_batches_per_put", "Group-commit batches carried by one PUT",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
s3_errors = Counter("agentos_s3_errors_total", "Failed object storage requests (retried)")
s3_unavailable = Gauge("agentos_s3_unavailable", "1 while object storage refuses the log's PUTs",
                       multiprocess_mode="livemax")
s3_synced_records = Counter("agentos_s3_synced_records_total", "SYNC records acknowledged after their PUT")
lease_renewals = Counter("agentos_lease_renewals_total", "Renewals of this node's lease")
failovers = Counter("agentos_failovers_total", "Times this node took the lease from an expired holder")
lease_epoch = Gauge("agentos_lease_epoch", "Epoch of the lease this node holds (0: none)", multiprocess_mode="livemax")

process_restarts = Counter("agentos_process_restarts_total", "Child processes restarted by the supervisor",
                           ["role"])
processes_up = Gauge("agentos_processes_up", "Child processes running", multiprocess_mode="livesum")


# -- buffered updates for hot paths ----------------------------------------------------------
# In multiprocess mode every update takes a lock and writes a memory-mapped file (~4 µs). Hot
# paths add to these dicts instead, and `flush()` (about once a second, from the service runner)
# applies the sums: one file write per metric per second rather than per event.

_counts: dict[object, float] = {}
_observed: dict[Histogram, list] = {}


def inc(counter, amount: float = 1.0) -> None:
    """Add to a counter (or a labelled child) at the next flush."""
    _counts[counter] = _counts.get(counter, 0.0) + amount


def observe(histogram: Histogram, value: float) -> None:
    """Record an observation at the next flush."""
    entry = _observed.get(histogram)
    if entry is None:
        entry = _observed[histogram] = [0.0, [0] * len(histogram._upper_bounds)]
    entry[0] += value
    # Histogram.observe counts the first bucket whose bound is >= the value; so does bisect_left.
    entry[1][bisect.bisect_left(histogram._upper_bounds, value)] += 1


def flush() -> None:
    counts, observed = dict(_counts), dict(_observed)
    _counts.clear()
    _observed.clear()
    for counter, amount in counts.items():
        counter.inc(amount)
    for histogram, (total, buckets) in observed.items():
        histogram._sum.inc(total)
        for index, n in enumerate(buckets):
            if n:
                histogram._buckets[index].inc(n)


class Totals:
    """Running totals a process keeps in plain ints, added to their counters as they grow (for
    callers that report about once a second)."""

    def __init__(self) -> None:
        self._reported: dict[object, float] = {}

    def report(self, counter, total: float) -> None:
        delta = total - self._reported.get(counter, 0)
        if delta:
            counter.inc(delta)
            self._reported[counter] = total


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render() -> bytes:
    """Prometheus text for the whole tree (or for this process when not supervised)."""
    path = multiproc_dir()
    if path:
        registry = CollectorRegistry()
        metrics_files.TreeCollector(registry, path=path)
        return generate_latest(registry)
    from prometheus_client import REGISTRY
    return generate_latest(REGISTRY)


def mark_dead(pid: int, fold: bool = True) -> None:
    """A process of the tree was reaped (see agentos/metrics_files.py); `fold=False` leaves its
    counts for one `fold_dead()` after many."""
    path = multiproc_dir()
    if path:
        metrics_files.retire(pid, path, fold)


def fold_dead() -> None:
    path = multiproc_dir()
    if path:
        metrics_files.fold_dead(path)
