"""Closed-loop load against Restate's ingress: the step scenarios, their timing and the window.

Owns: the scenario table (which call each scenario makes, what it counts, what it times), the
preparation of state before a window, N clients each on one keep-alive HTTP/1.1 connection
(actors/http1.py), the warm-up then measured window, and the result row with the CPU seconds the
Restate and service process trees used in that window. Never does: start or stop processes
(bench/peer_restate.py) or write results files.

Every client sends its next request when the last one returned. An operation counts in the
window when it *ended* inside it; `ops_per_sec` is those operations (times 10 for the step
scenarios, whose unit is steps/s) over the window's length. Latency is per operation as the
client sees it, except for `channel_wake`. Requests still running when the window closes are
left to finish (bounded by DRAIN_SECS) so that no workflow is abandoned mid-cycle.

| scenario           | one operation                                                          |
|--------------------|------------------------------------------------------------------------|
| `sync_steps`       | POST /Steps/sync10: 10 steps awaited one by one (latency: the call)    |
| `async_steps`      | POST /Steps/async10: 10 steps started together, one gather (the call)  |
| `flows`            | POST /Flow/{new id}/run: workflow with one step, to completion         |
| `attr_read`        | POST /Attr/{key}/get: shared handler reading one state key             |
| `attr_update`      | POST /Attr/{key}/incr: exclusive read-modify-write of one key          |
| `attr_read_10x16k` | POST /Big/{key}/read10: shared handler returning ten 16 KiB values     |
| `channel_wake`     | send Wake/{id}/run; POST Wake/{id}/wake; GET …/attach (the result)     |

Keys walk a fixed set of KEYS objects, prepared (incremented or filled) before the warm-up;
client i uses key (i + n) % KEYS for its n-th call.

`channel_wake` times only the wake: its p50/p99 are `step_started_at - resolved_at`, both
time.time() in the service process — `resolved_at` taken in the `wake` handler right before it
issues the promise resolve (after the waiting workflow has signalled, through a `ready` promise,
that it reached its wait), `step_started_at` taken as the first thing the step after the wake
runs. `client_p50_ms`/`client_p99_ms` time the same from the moment the client sent the wake
request (time.time() in this process, same machine clock). Starting the workflow and fetching
its result are untimed setup, as in the reference benchmark; they count in ops/s.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import orjson

from actors.http1 import BufferedResponse, Endpoint, build_request, open_connection, parse_endpoint
from bench.peer_opencode import tree_cpu_secs
from bench.stats import percentile

KEYS = 64
BIG_VALUE_BYTES = 16 * 1024
STEPS_PER_CALL = 10  # bench/restate_services.py STEPS_PER_CALL (not imported: it pulls in the SDK)
REQUEST_TIMEOUT_SECS = 30.0
DRAIN_SECS = 10.0
ERROR_BACKOFF_SECS = 0.01
PREPARE_CONCURRENCY = 16
JSON = {"content-type": "application/json"}


class PeerServer(Protocol):
    ingress_url: str | None

    def server_pids(self) -> list[int]: ...

    def service_pids(self) -> list[int]: ...


class OpError(Exception):
    """A call answered with an unexpected status or body."""


class Ingress:
    """One keep-alive connection to the ingress, reopened after a failure or a close."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.conn = None

    async def call(self, request: bytes, expect: tuple[int, ...] = (200,)) -> bytes:
        if self.conn is None or self.conn.closed:
            self.conn = await open_connection(self.ep, REQUEST_TIMEOUT_SECS)
        future = asyncio.get_running_loop().create_future()
        self.conn.send(request, BufferedResponse(future))
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECS):
                status, _, body = await future
        except BaseException:
            self.conn.abort()  # a late response must not land on the next request
            raise
        if status not in expect:
            raise OpError(f"HTTP {status}: {body[:200]!r}")
        return body

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Client:
    """What an operation needs: its index, how many calls it made, its connection, the run tag."""

    __slots__ = ("index", "n", "ingress", "tag", "ep", "requests", "extra")

    def __init__(self, index: int, ingress: Ingress, tag: str, requests: Sequence[bytes]) -> None:
        self.index, self.n, self.ingress, self.tag = index, 0, ingress, tag
        self.ep = ingress.ep
        self.requests = requests  # prebuilt per key, when the path depends only on the key
        self.extra: float | None = None  # channel_wake: latency from the client's send

    def keyed(self) -> bytes:
        return self.requests[(self.index + self.n) % len(self.requests)]


Op = Callable[[Client], Awaitable[float | None]]  # returns a latency override, or None


class Scenario(NamedTuple):
    unit: str
    per_op: int  # counted units per completed operation
    path: str | None  # a POST path with {key}, prebuilt per key; None: the op builds its own
    op: Op
    prepare: Callable[[Ingress, int], Awaitable[None]] | None = None


async def _keyed_call(c: Client) -> None:
    await c.ingress.call(c.keyed())


async def _flow(c: Client) -> None:
    wid = f"{c.tag}-{c.index}-{c.n}"
    await c.ingress.call(build_request(c.ep, "POST", f"/Flow/{wid}/run", None))


async def _channel_wake(c: Client) -> float:
    wid = f"{c.tag}-{c.index}-{c.n}"
    await c.ingress.call(build_request(c.ep, "POST", f"/Wake/{wid}/run/send", None),
                         expect=(200, 202))
    sent = orjson.dumps(time.time())
    resolved_at = orjson.loads(await c.ingress.call(
        build_request(c.ep, "POST", f"/Wake/{wid}/wake", sent, JSON)))
    result = orjson.loads(await c.ingress.call(
        build_request(c.ep, "GET", f"/restate/workflow/Wake/{wid}/attach", None)))
    c.extra = result["step_started_at"] - result["client_sent_at"]
    return result["step_started_at"] - resolved_at


async def _prepare_each(ingress: Ingress, keys: int, make: Callable[[int], bytes]) -> None:
    """One call per key; PREPARE_CONCURRENCY connections so large key sets stay quick."""
    lanes = [ingress] + [Ingress(ingress.ep) for _ in range(PREPARE_CONCURRENCY - 1)]

    async def lane(i: int) -> None:
        for key in range(i, keys, len(lanes)):
            await lanes[i].call(make(key))

    try:
        await asyncio.gather(*(lane(i) for i in range(len(lanes))))
    finally:
        for extra in lanes[1:]:
            extra.close()


async def _prepare_attr(ingress: Ingress, keys: int) -> None:
    await _prepare_each(ingress, keys, lambda k: build_request(
        ingress.ep, "POST", f"/Attr/k{k}/incr", None))


async def _prepare_big(ingress: Ingress, keys: int) -> None:
    await _prepare_each(ingress, keys, lambda k: build_request(
        ingress.ep, "POST", f"/Big/k{k}/fill", orjson.dumps(BIG_VALUE_BYTES), JSON))


SCENARIOS: dict[str, Scenario] = {
    "sync_steps": Scenario("steps/s", STEPS_PER_CALL, "/Steps/sync10", _keyed_call),
    "async_steps": Scenario("steps/s", STEPS_PER_CALL, "/Steps/async10", _keyed_call),
    "flows": Scenario("ops/s", 1, None, _flow),
    "attr_read": Scenario("ops/s", 1, "/Attr/k{key}/get", _keyed_call, _prepare_attr),
    "attr_update": Scenario("ops/s", 1, "/Attr/k{key}/incr", _keyed_call, _prepare_attr),
    "attr_read_10x16k": Scenario("ops/s", 1, "/Big/k{key}/read10", _keyed_call, _prepare_big),
    "channel_wake": Scenario("ops/s", 1, None, _channel_wake),
}


# -------------------------------------------------------------------------------- the window
class Sample(NamedTuple):
    end: float  # perf_counter() when the operation returned
    latency: float  # seconds
    extra: float | None  # channel_wake: seconds from the client's send


def window_stats(samples: Sequence[Sample], error_ends: Sequence[float], start: float,
                 end: float, per_op: int) -> dict[str, Any]:
    """Rate and latency of the operations that ended in [start, end)."""
    if end <= start:
        raise ValueError(f"empty window [{start}, {end})")
    inside = [s for s in samples if start <= s.end < end]
    latencies = sorted(s.latency for s in inside)
    extras = sorted(s.extra for s in inside if s.extra is not None)
    out: dict[str, Any] = {
        "ops_per_sec": len(inside) * per_op / (end - start),
        "completed": len(inside),
        "p50_ms": _ms(latencies, 50),
        "p99_ms": _ms(latencies, 99),
        "errors": sum(1 for t in error_ends if start <= t < end),
        "window_secs": end - start,
    }
    if extras:
        out["client_p50_ms"], out["client_p99_ms"] = _ms(extras, 50), _ms(extras, 99)
    return out


def _ms(ordered: Sequence[float], pct: float) -> float | None:
    return round(percentile(ordered, pct) * 1000, 3) if ordered else None


def machine_busy_secs() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is inside user


def check_args(scenario: str, clients: int, warmup_secs: float, duration_secs: float) -> Scenario:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if warmup_secs < 0 or duration_secs <= 0:
        raise ValueError("warmup_secs must be >= 0 and duration_secs > 0")
    return SCENARIOS[scenario]


def prebuilt(ep: Endpoint, path: str | None, keys: int) -> list[bytes]:
    if path is None:
        return []
    if "{key}" not in path:
        return [build_request(ep, "POST", path, None)]
    return [build_request(ep, "POST", path.format(key=k), None) for k in range(keys)]


async def run_scenario_async(server: PeerServer, scenario: str, clients: int,
                             warmup_secs: float, duration_secs: float, *,
                             keys: int = KEYS) -> dict[str, Any]:
    """`run_scenario` on the caller's running event loop."""
    spec = check_args(scenario, clients, warmup_secs, duration_secs)
    if not server.ingress_url:
        raise ValueError("the server is not started")
    ep = parse_endpoint(server.ingress_url)
    setup = Ingress(ep)
    try:
        if spec.prepare is not None:
            await spec.prepare(setup, keys)
    finally:
        setup.close()
    requests = prebuilt(ep, spec.path, keys)
    tag = uuid.uuid4().hex[:10]  # new workflow ids on every run against the same server
    samples: list[Sample] = []
    error_ends: list[float] = []
    errors_seen: list[str] = []
    stop = asyncio.Event()

    async def client_loop(c: Client) -> None:
        try:
            while not stop.is_set():
                began = time.perf_counter()
                try:
                    override = await spec.op(c)
                except (OpError, OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                    error_ends.append(time.perf_counter())
                    if len(errors_seen) < 5:
                        errors_seen.append(repr(exc)[:200])
                    await asyncio.sleep(ERROR_BACKOFF_SECS)
                else:
                    ended = time.perf_counter()
                    samples.append(Sample(ended, ended - began if override is None else override,
                                          c.extra))
                c.n += 1
        finally:
            c.ingress.close()

    tasks = [asyncio.create_task(client_loop(Client(i, Ingress(ep), tag, requests)))
             for i in range(clients)]
    try:
        await asyncio.sleep(warmup_secs)
        server_pids, service_pids = server.server_pids(), server.service_pids()
        cpu0 = (tree_cpu_secs(server_pids), tree_cpu_secs(service_pids), time.process_time(),
                machine_busy_secs())
        start = time.perf_counter()
        await asyncio.sleep(duration_secs)
        end = time.perf_counter()
        cpu1 = (tree_cpu_secs(server_pids), tree_cpu_secs(service_pids), time.process_time(),
                machine_busy_secs())
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_SECS)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    crashed = [o for o in outcomes if isinstance(o, Exception)]
    if crashed:  # a bug, not a failed call: do not report a rate measured without it
        raise crashed[0]
    row = {"scenario": scenario, "clients": clients, "unit": spec.unit}
    row.update(window_stats(samples, error_ends, start, end, spec.per_op))
    row.update(server_cpu_secs=round(cpu1[0] - cpu0[0], 3),
               service_cpu_secs=round(cpu1[1] - cpu0[1], 3),
               client_cpu_secs=round(cpu1[2] - cpu0[2], 3),
               machine_busy_secs=round(cpu1[3] - cpu0[3], 3),
               undrained=len(pending), error_samples=errors_seen)
    return row


def run_scenario(server: PeerServer, scenario: str, clients: int, warmup_secs: float,
                 duration_secs: float, *, keys: int = KEYS) -> dict[str, Any]:
    """Run one scenario point on a fresh uvloop event loop in this thread; the result row.

    Keys: scenario, clients, ops_per_sec, unit ("steps/s" or "ops/s"), p50_ms, p99_ms, errors,
    server_cpu_secs (Restate's process tree), service_cpu_secs (the Python service),
    window_secs; extras: completed, client_cpu_secs (this load driver), machine_busy_secs (all
    cores, every process: what is left after the three above is other load on a shared
    machine), undrained, error_samples, and for channel_wake client_p50_ms / client_p99_ms.
    """
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_scenario_async(server, scenario, clients, warmup_secs,
                                             duration_secs, keys=keys))
