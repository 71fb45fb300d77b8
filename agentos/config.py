"""Typed configuration: one dataclass per section, each default written once.

Owns loading the YAML file and applying `AGENTOS_<SECTION>_<KEY>` environment overrides; the
result is then checked (agentos/config_checks.py). Unknown keys are errors that name the key;
nothing here reads the environment at import time.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

# A checkpoint is one log record, and a record is at most 64 MiB (storage/records.py): half that
# leaves room for its fields and keeps a PUT's body in memory small.
MAX_CHECKPOINT_BYTES = 32 << 20

ENV_PREFIX = "AGENTOS_"
TENANT_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the key."""


@dataclass
class GatewayConfig:
    listen: str = "127.0.0.1:8080"
    max_body_bytes: int = 1 << 20
    max_input_chars: int = 200_000
    retry_after_secs: int = 1
    checkpoint_cache_mb: int = 64     # newest checkpoint per session, kept for GET …/checkpoints/latest
    # Serve the two checkpoint routes on a lean HTTP/1.1 path (gateway/fast_path.py); every other
    # request, and any unusual one, is aiohttp's either way.
    fast_checkpoints: bool = True
    # After answering on that path, poll the sockets this long before the loop sleeps: a client
    # whose next request follows at once (read latest, then commit; one write after another)
    # finds the loop awake instead of paying a wakeup. 0: sleep at once.
    poll_after_answer_usecs: float = 150.0
    # A turn whose actor stays silent this long is probed (resume request) so a lost
    # message or a dead actor never leaves a stream hanging.
    turn_probe_secs: float = 5.0


@dataclass
class KernelConfig:
    actors: int = 0
    max_in_flight_turns: int = 0
    max_in_flight_turns_per_tenant: int = 0   # one tenant's share of the gate; 0 = no share
    concurrency_limit: int = 64
    session_ttl_secs: float = 300.0
    drain_secs: float = 30.0
    max_steps_per_turn: int = 8
    # How many of one model answer's tool calls run at once (1: one after another).
    tool_calls_at_once: int = 8
    # Tools whose calls a person approves before they run (comma-separated names, "*": every
    # tool; actors/tool_approvals.py), and how long a call waits for that before it is denied.
    approve_tools: str = ""
    approval_timeout_secs: float = 600.0
    # Flow queues, how many of a queue's runs run at once and, after @, how many are admitted in
    # any window of seconds, for each key (tenant) apart if "per key" ("per tenant")
    # ("reports=2, mail=10@50/30s, hooks=*@5/1s, per_user=1 per key, fair=5 per tenant";
    # actors/flow_queues.py): a start naming one waits, enqueued, for a place.
    flow_queues: str = ""
    run_dir: str = ""
    # A turn whose client disconnected is cancelled after this grace, unless a client resumes its
    # stream (GET /v1/sessions/{sid}/turns/{turn_id}/events) first.
    disconnect_grace_secs: float = 2.0
    turn_retention_secs: float = 30.0     # a finished turn's events stay replayable this long
    # After a turn's first token goes out, later tokens are merged into one delta per window:
    # fewer messages and SSE writes, no change to time to first token.
    delta_window_ms: float = 50.0
    # Fork children from a process that has their modules imported (agentos/forkserver.py);
    # false: each child starts with `python -m agentos.child` and imports its own.
    fork_server: bool = True
    # The gateway on a CPU of its own, writer/store and background threads off it, where the server
    # has two CPUs or more (agentos/cpu_layout.py); false: the kernel places every process.
    gateway_own_cpu: bool = True
    # Which: -1, the last CPU no other server's gateway (this user's) holds; N, CPU N (the
    # benchmarks pin the last one, as every server did before claims: their trees, one after
    # another or side by side, then run where the disk's interrupts land alike).
    gateway_cpu: int = -1


@dataclass
class ProviderConfig:
    base_url: str = ""
    model: str = "mock"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_secs: float = 120.0
    connect_timeout_secs: float = 10.0
    max_retries: int = 2
    # The most characters of a session's history (as JSON) a model call is sent: the current turn
    # whole and the newest older exchanges that fit (actors/context_window.py); 0 = all of it.
    max_context_chars: int = 0
    # Instructions sent first in every model call, as a system message (not part of the transcript,
    # nor of max_context_chars); "" = none.
    system_prompt: str = ""


@dataclass
class S3Config:
    bucket: str = ""
    prefix: str = ""
    endpoint_url: str = ""
    region: str = ""
    # Log PUTs in flight at once (acks follow the contiguous prefix). One: everything that arrives
    # during a PUT rides the next one — the bucket's group commit, fewest requests. Raise it when
    # the bucket's latency, not its request count, is what limits you.
    max_inflight_puts: int = 1


@dataclass
class ClusterConfig:
    """One active node per bucket: it holds the lease object; a standby takes it when it expires."""
    node_id: str = ""                 # "" = generated at start (host, port, random)
    lease_renew_secs: float = 4.0     # an idle node makes about 1/lease_renew_secs PUTs per second
    lease_ttl_secs: float = 12.0
    put_price_per_1000: float = 0.005  # USD, for `agent-os status`'s cost estimate
    epoch: int = 0                    # set at start: the lease epoch this node writes under


@dataclass
class StorageConfig:
    dir: str = "./data"
    durability: str = "local"
    jsonl_dir: str = ""
    snapshot_every: int = 16
    segment_bytes: int = 64 << 20
    # Each log segment is written full of zeros before use, so a commit overwrites allocated blocks
    # and its fdatasync writes no metadata (no inode write, no ext4 journal commit;
    # storage/segments.py). False appends to plain files instead: half the bytes written, a slower
    # fdatasync on ext4 — for copy-on-write filesystems (btrfs, ZFS), where an overwrite allocates
    # anew anyway (PostgreSQL's wal_init_zero).
    zero_segments: bool = True
    # Zeroed segments kept ready per log (storage/spares.py): beyond the next one, zeroed while the
    # log is idle once it has filled a segment, so a burst of up to this many segments of records
    # writes no zeros meanwhile. Costs this many segments of disk per log; 1: only the next one.
    spare_segments: int = 4
    min_free_bytes: int = -1   # appends stop this near a full disk (storage/free_space.py); -1 auto, 0 off
    max_checkpoint_bytes: int = 1 << 20
    log_writers: int = 1
    # The gateway group-commits its own records (checkpoint PUTs, access rows) to a log of its
    # own, index `log_writers`, instead of sending them to a writer/log process (storage/log_writer.py).
    gateway_log: bool = True
    # closed runs and access rows older than this leave the log, the bucket and DuckDB
    retention_secs: float = 7 * 24 * 3600.0
    # a pass reads only the segments sealed since the last one; a busy checkpointer writes tens
    # of MB/s, most of it superseded within seconds
    compaction_interval_secs: float = 30.0
    # writer/store rewrites half-garbage payload segments once they are this big (or 1/16 of their disk)
    payload_compaction_min_mb: float = 64.0
    # Group commit: after a batch that served k senders, wait up to this long for about k
    # messages before the next fsync (their acks just went out, they are about to send again).
    commit_window_us: int = 2000
    duckdb_memory_limit_mb: int = 64
    duckdb_recycle_secs: float = 300.0   # the DuckDB files are reopened this often (their native memory starts over)
    s3: S3Config = field(default_factory=S3Config)


@dataclass
class BrokerConfig:
    transport: str = "ipc"              # ipc (one host) or tcp (ZeroMQ CURVE: keys from `agent-os keys`)
    listen: str = "127.0.0.1:7600"      # with tcp: the bus
    trace_listen: str = "127.0.0.1:7601"  # with tcp: the trace tap
    keys_dir: str = ""                  # with tcp: "" = <storage.dir>/keys
    # with tcp: the key pair this process connects with, `<keys_dir>/<name>.key_secret`: "" = the
    # node's own (`client`); a remote worker's is the name `agent-os keys --client` made it under
    client_key: str = ""
    heartbeat_secs: float = 1.0
    peer_timeout_secs: float = 3.0
    spill_ring_bytes: int = 8 << 20     # with ipc: each process's ring in /dev/shm for big bodies (0: off)


@dataclass
class MockConfig:
    """Profile of the bundled mock model started when `provider.base_url` is empty."""
    ttft_ms: float = 2000.0
    tps: float = 200.0
    tokens: int = 8
    port: int = 0


@dataclass
class AuthConfig:
    api_keys: dict[str, str] = field(default_factory=dict)


@dataclass
class Config:
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    provider: ProviderConfig = field(default_factory=ProviderConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    mock: MockConfig = field(default_factory=MockConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def actor_count(self) -> int:
        return self.kernel.actors or (os.cpu_count() or 1)

    @property
    def logs(self) -> int:
        """How many write-ahead logs there are: one per writer/log process, plus the gateway's."""
        return self.storage.log_writers + (1 if self.storage.gateway_log else 0)

    @property
    def gateway_log_index(self) -> int | None:
        return self.storage.log_writers if self.storage.gateway_log else None

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_listen(self.gateway.listen, "gateway.listen")


def parse_listen(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{key}: port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{key}: port {number} out of range")
    return host.strip("[]"), number


def load(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The configuration from an optional YAML file plus environment overrides, validated."""
    raw: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
    from agentos.config_checks import validate   # (it reads this module's names)

    config = from_dict(raw)
    apply_env(config, os.environ if environ is None else environ)
    validate(config)
    return config


def from_dict(raw: Mapping[str, Any]) -> Config:
    config = Config()
    _merge(config, raw, "")
    return config


def _merge(target: Any, raw: Mapping[str, Any], path: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    for key, value in raw.items():
        dotted = f"{path}{key}"
        if key not in fields:
            raise ConfigError(f"unknown config key {dotted!r}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{dotted}: expected a mapping")
            _merge(current, value, dotted + ".")
        else:
            setattr(target, key, _coerce(value, type(current), dotted))


def _coerce(value: Any, kind: type, key: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif kind is dict:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value) or {}
            except yaml.YAMLError:
                raise ConfigError(f"{key}: expected a mapping") from None
        if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping of strings to strings")
    raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")


def _env_keys(target: Any, path: str) -> dict[str, tuple[Any, str, str]]:
    """Every leaf key as ENV_NAME -> (owner object, attribute, dotted key)."""
    out: dict[str, tuple[Any, str, str]] = {}
    for f in dataclasses.fields(target):
        value = getattr(target, f.name)
        dotted = f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(_env_keys(value, dotted + "."))
        else:
            out[ENV_PREFIX + dotted.replace(".", "_").upper()] = (target, f.name, dotted)
    return out


def apply_env(config: Config, environ: Mapping[str, str]) -> None:
    keys = _env_keys(config, "")
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name not in keys:
            raise ConfigError(f"unknown environment override {name} (no such config key)")
        owner, attr, dotted = keys[name]
        setattr(owner, attr, _coerce(value, type(getattr(owner, attr)), f"{dotted} (from {name})"))
