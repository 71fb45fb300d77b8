"""Every Prometheus metric of the process tree, declared once.

prometheus-client's multiprocess mode: each process writes its values to memory-mapped files in
PROMETHEUS_MULTIPROC_DIR (set by the supervisor before any child starts), and the gateway's
/metrics sums them. Counters of a process that died stay in the sum, so totals survive restarts;
live gauges of a dead process are removed by the supervisor (mark_process_dead).

Hot paths never touch these per message: they count in plain ints and flush here about once a
second (see `Flusher`).
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess

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

process_restarts = Counter("agentos_process_restarts_total", "Child processes restarted by the supervisor",
                           ["role"])
processes_up = Gauge("agentos_processes_up", "Child processes running", multiprocess_mode="livesum")


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render() -> bytes:
    """Prometheus text for the whole tree (or for this process when not supervised)."""
    path = multiproc_dir()
    if path:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
        return generate_latest(registry)
    from prometheus_client import REGISTRY
    return generate_latest(REGISTRY)


def mark_dead(pid: int) -> None:
    path = multiproc_dir()
    if path:
        multiprocess.mark_process_dead(pid, path)
