"""The checks a configuration passes once loaded (agentos/config.py's `load`), before anything
starts: each key's range, and the keys that must agree with one another."""
from __future__ import annotations

from agentos.config import MAX_CHECKPOINT_BYTES, TENANT_NAME, Config, ConfigError, parse_listen


def _positive(value: float, key: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(config: Config) -> None:
    parse_listen(config.gateway.listen, "gateway.listen")
    _positive(config.gateway.max_body_bytes, "gateway.max_body_bytes")
    _positive(config.gateway.max_input_chars, "gateway.max_input_chars")
    _positive(config.gateway.retry_after_secs, "gateway.retry_after_secs")
    _positive(config.gateway.checkpoint_cache_mb, "gateway.checkpoint_cache_mb", allow_zero=True)
    _positive(config.gateway.turn_probe_secs, "gateway.turn_probe_secs")
    _positive(config.gateway.poll_after_answer_usecs, "gateway.poll_after_answer_usecs", allow_zero=True)
    _positive(config.kernel.actors, "kernel.actors", allow_zero=True)
    if config.kernel.gateway_cpu < -1:
        raise ConfigError(f"kernel.gateway_cpu: -1 (claim one) or a CPU number, got {config.kernel.gateway_cpu}")
    if config.kernel.actors > 256:
        raise ConfigError(f"kernel.actors: at most 256, got {config.kernel.actors}")
    _positive(config.kernel.max_in_flight_turns, "kernel.max_in_flight_turns", allow_zero=True)
    _positive(config.kernel.concurrency_limit, "kernel.concurrency_limit")
    _positive(config.kernel.session_ttl_secs, "kernel.session_ttl_secs")
    _positive(config.kernel.drain_secs, "kernel.drain_secs", allow_zero=True)
    _positive(config.kernel.max_steps_per_turn, "kernel.max_steps_per_turn")
    _positive(config.kernel.tool_calls_at_once, "kernel.tool_calls_at_once")
    _positive(config.kernel.approval_timeout_secs, "kernel.approval_timeout_secs")
    from actors.flow_queues import QueueSpecError, parse_queues
    try:
        parse_queues(config.kernel.flow_queues)
    except QueueSpecError as exc:
        raise ConfigError(f"kernel.flow_queues: {exc}") from None
    _positive(config.kernel.delta_window_ms, "kernel.delta_window_ms", allow_zero=True)
    _positive(config.kernel.disconnect_grace_secs, "kernel.disconnect_grace_secs", allow_zero=True)
    _positive(config.kernel.turn_retention_secs, "kernel.turn_retention_secs")
    if config.provider.base_url and not config.provider.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"provider.base_url: must start with http:// or https://, got {config.provider.base_url!r}")
    _positive(config.provider.timeout_secs, "provider.timeout_secs")
    _positive(config.provider.connect_timeout_secs, "provider.connect_timeout_secs")
    _positive(config.provider.max_retries, "provider.max_retries", allow_zero=True)
    _positive(config.provider.max_context_chars, "provider.max_context_chars", allow_zero=True)
    if config.storage.durability not in ("none", "local", "s3"):
        raise ConfigError(f"storage.durability: one of none, local, s3; got {config.storage.durability!r}")
    if config.storage.durability == "s3" and not config.storage.s3.bucket:
        raise ConfigError("storage.durability: s3 needs storage.s3.bucket")
    _positive(config.storage.snapshot_every, "storage.snapshot_every")
    _positive(config.storage.segment_bytes, "storage.segment_bytes")
    if config.storage.min_free_bytes < -1:
        raise ConfigError(f"storage.min_free_bytes: -1 (auto), 0 (off) or bytes, got {config.storage.min_free_bytes}")
    if not 1 <= config.storage.spare_segments <= 64:
        raise ConfigError(f"storage.spare_segments: 1..64, got {config.storage.spare_segments}")
    _positive(config.storage.max_checkpoint_bytes, "storage.max_checkpoint_bytes")
    if config.storage.max_checkpoint_bytes > MAX_CHECKPOINT_BYTES:   # one checkpoint is one log record
        raise ConfigError(f"storage.max_checkpoint_bytes: at most {MAX_CHECKPOINT_BYTES} (32 MiB), "
                          f"got {config.storage.max_checkpoint_bytes}")
    _positive(config.storage.commit_window_us, "storage.commit_window_us", allow_zero=True)
    _positive(config.storage.retention_secs, "storage.retention_secs")
    _positive(config.storage.compaction_interval_secs, "storage.compaction_interval_secs")
    _positive(config.storage.payload_compaction_min_mb, "storage.payload_compaction_min_mb", allow_zero=True)
    if not 1 <= config.storage.s3.max_inflight_puts <= 64:
        raise ConfigError(f"storage.s3.max_inflight_puts: 1..64, got {config.storage.s3.max_inflight_puts}")
    if config.storage.s3.endpoint_url and not config.storage.s3.endpoint_url.startswith(("http://", "https://")):
        raise ConfigError(f"storage.s3.endpoint_url: must start with http:// or https://, got "
                          f"{config.storage.s3.endpoint_url!r}")
    _positive(config.cluster.lease_renew_secs, "cluster.lease_renew_secs")
    if config.cluster.lease_ttl_secs < 2 * config.cluster.lease_renew_secs:
        raise ConfigError("cluster.lease_ttl_secs: must be at least twice cluster.lease_renew_secs")
    if not 1 <= config.storage.log_writers <= 64:
        raise ConfigError(f"storage.log_writers: 1..64, got {config.storage.log_writers}")
    _positive(config.storage.duckdb_recycle_secs, "storage.duckdb_recycle_secs", allow_zero=True)
    if config.storage.duckdb_memory_limit_mb < 16:
        raise ConfigError(f"storage.duckdb_memory_limit_mb: at least 16, got {config.storage.duckdb_memory_limit_mb}")
    if config.broker.transport not in ("ipc", "tcp"):
        raise ConfigError(f"broker.transport: ipc or tcp, got {config.broker.transport!r}")
    parse_listen(config.broker.listen, "broker.listen")
    parse_listen(config.broker.trace_listen, "broker.trace_listen")
    _positive(config.broker.heartbeat_secs, "broker.heartbeat_secs")
    if config.broker.spill_ring_bytes and not 1 << 20 <= config.broker.spill_ring_bytes <= 1 << 30:
        raise ConfigError("broker.spill_ring_bytes: 0 (off) or 1 MiB to 1 GiB")
    if config.broker.peer_timeout_secs <= config.broker.heartbeat_secs:
        raise ConfigError("broker.peer_timeout_secs: must be longer than broker.heartbeat_secs")
    for key, tenant in config.auth.api_keys.items():
        if not key or not TENANT_NAME.match(tenant):
            raise ConfigError(f"auth.api_keys: tenant names are 1-64 letters, digits and . _ -; got {tenant!r}")
    _positive(config.kernel.max_in_flight_turns_per_tenant, "kernel.max_in_flight_turns_per_tenant", allow_zero=True)
    _positive(config.mock.ttft_ms, "mock.ttft_ms", allow_zero=True)
    _positive(config.mock.tps, "mock.tps")
    _positive(config.mock.tokens, "mock.tokens")
    if not 0 <= config.mock.port <= 65535:
        raise ConfigError(f"mock.port: out of range: {config.mock.port}")
