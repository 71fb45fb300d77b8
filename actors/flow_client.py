"""Flows from Python code: start, fork, read, update, publish to and cancel runs over the bus.

The gateway's HTTP routes and the step benchmark both use this client; it talks to each run's
owning actor directly (no worker involved in reads).
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from typing import Any

from actors.flow_runs import run_id_for_key
from actors.flow_state import WAITABLE  # noqa: F401 — callers of get(until=…) find it here
from broker.client import Bus, BusError
from broker.protocol import Kind
from broker.sharding import actor_name


POLL_ATTEMPT_SECS = 20.0   # the longest attempt of a long poll (FlowClient._ask)
WRITES = frozenset({Kind.FLOW_START, Kind.FLOW_CANCEL, Kind.CHANNEL_PUBLISH, Kind.CHANNEL_BROADCAST, Kind.ATTR_UPDATE})


def new_run_id() -> str:
    """`r`, the milliseconds since the epoch (12 hex digits), 80 random bits: ids sort in the
    order their runs began, so the listing of runs (by id) is in that order too, and a page of it
    reads only the row groups near its cursor (their ids' ranges rule out the rest). With ids in
    no order a page reads the whole `run` column: 25-33 ms at 100,000 runs, against 6-9 ms
    (bench/results/2026-12-06-run-listing-dec06-fiftyfirst-2/)."""
    return f"r{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


class FlowError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FlowClient:
    def __init__(self, bus: Bus, shards: int, tenant: str = "default", timeout: float = 30.0) -> None:
        self.bus = bus
        self.shards = shards
        self.tenant = tenant
        self.timeout = timeout

    async def _ask(self, run_id: str, kind: Kind, body: dict[str, Any], timeout: float | None = None,
                   actor: str | None = None, polls: float = 0.0) -> dict:
        """`polls`: the seconds the actor may hold the request before it answers (a long poll).
        Each attempt lasts that much longer, up to POLL_ATTEMPT_SECS: else a read held 60 s was
        sent again every 5 s, and each copy waited in the actor beside the first (re-sent reads
        are run again). Not longer: an attempt is also how a request the broker lost as it died
        is sent again."""
        timeout = timeout or self.timeout
        if kind in WRITES:   # not acted on once this has given up (broker/protocol.py past_deadline)
            body = {**body, "deadline": time.time() + timeout}
        try:
            reply = await self.bus.request(actor or actor_name(run_id, self.shards), kind, body,
                                           timeout=timeout, attempt_secs=min(5.0 + polls, POLL_ATTEMPT_SECS),
                                           session=run_id)
        except BusError as exc:
            who = actor or "the run's actor"
            raise FlowError("unavailable", f"{who} did not answer: {exc}") from None
        code = reply.body.get("code")
        if code:
            raise FlowError(code, reply.body.get("error") or code)
        return reply.body

    async def start(self, flow: str, input: Any = None, run_id: str | None = None, key: str | None = None,
                    tenant: str | None = None, start_at: float | None = None,
                    timeout_secs: float | None = None, queue: str | None = None, priority: int = 0,
                    queue_key: str | None = None) -> dict:
        """Start a run; with `run_id` or an idempotency `key`, a repeated start returns the same run.
        With `start_at` (epoch seconds), the run exists at once and runs from that time on; with
        `timeout_secs`, it is cancelled if it has not ended that long after it began; with `queue`
        (one of `kernel.flow_queues`), it runs when that queue has a place for it, before the runs
        waiting there with a higher `priority` number; in a queue per key, a place of its
        `queue_key`'s."""
        tenant = tenant or self.tenant
        return await self.start_run(flow, input, *self.run_id(flow, tenant, run_id, key), tenant, start_at,
                                    timeout_secs, queue, priority, queue_key)

    @staticmethod
    def run_id(flow: str, tenant: str, run_id: str | None, key: str | None) -> tuple[str, bool]:
        """(the run's id, whether it is brand new): chosen, derived from the key, or generated."""
        if run_id:
            return run_id, False
        if key:
            return run_id_for_key(flow, tenant, key), False
        return new_run_id(), True

    async def start_run(self, flow: str, input: Any, run_id: str, new: bool, tenant: str,
                        start_at: float | None = None, timeout_secs: float | None = None,
                        queue: str | None = None, priority: int = 0, queue_key: str | None = None) -> dict:
        body = {"flow": flow, "run_id": run_id, "tenant": tenant, "input": input}
        if queue:
            body["queue"] = queue
            if priority:
                body["priority"] = priority
            if queue_key:
                body["queue_key"] = queue_key
        if start_at:
            body["start_at"] = float(start_at)
        if timeout_secs:
            body["timeout_secs"] = float(timeout_secs)
        if new:
            body["new"] = True
        return await self._ask(run_id, Kind.FLOW_START, body)

    async def fork(self, source: str, from_seq: int | None = None, run_id: str | None = None, key: str | None = None,
                   tenant: str | None = None, queue: str | None = None) -> dict:
        """A new run of `source`'s flow and input that begins with the recorded outcomes of its
        operations before `from_seq` (default: its first that did not succeed) and goes on from
        there (actors/run_forks.py). With `run_id` or an idempotency `key`, a repeated fork
        returns the same run. It waits in `source`'s flow queue, if any, or in `queue`."""
        tenant = tenant or self.tenant
        chosen, new = self.fork_id(source, tenant, run_id, key)
        return await self.fork_run(source, from_seq, chosen, new, tenant, queue)

    @staticmethod
    def fork_id(source: str, tenant: str, run_id: str | None, key: str | None) -> tuple[str, bool]:
        """As `run_id`, with a key's id derived from the run forked (a fork has no flow of its own
        to name)."""
        if key and not run_id:
            return f"fork-{hashlib.sha1(f'{tenant}|fork|{source}|{key}'.encode()).hexdigest()[:20]}", False
        return FlowClient.run_id("", tenant, run_id, None)

    async def fork_run(self, source: str, from_seq: int | None, run_id: str, new: bool, tenant: str,
                       queue: str | None = None) -> dict:
        body: dict[str, Any] = {"fork_of": source, "fork_seq": from_seq, "run_id": run_id, "tenant": tenant}
        if new:
            body["new"] = True
        if queue:
            body["queue"] = queue
        return await self._ask(run_id, Kind.FLOW_START, body)

    async def get(self, run_id: str, wait: float = 0.0, tenant: str | None = None, until: str | None = None) -> dict:
        """The run's summary; with `wait`, once it ends (or, with `until="suspended"`, once it is
        suspended: waiting for a message, a timer or a child) or `wait` seconds pass."""
        body: dict[str, Any] = {"run_id": run_id, "tenant": tenant or self.tenant}
        if wait:
            body["wait"] = float(wait)
        if until:
            body["until"] = until
        return await self._ask(run_id, Kind.FLOW_GET, body, timeout=self.timeout + wait, polls=wait)

    async def steps(self, run_id: str, after: int = -1, limit: int = 100,
                    tenant: str | None = None) -> tuple[list[dict], int | None]:
        """A page of the run's operations after seq `after`, and the seq to ask after next (None:
        none are left now)."""
        reply = await self._ask(run_id, Kind.FLOW_STEPS, {"run_id": run_id, "tenant": tenant or self.tenant,
                                                          "after": after, "limit": limit})
        return reply.get("ops") or [], reply.get("next_after")

    async def emitted(self, run_id: str, after: int = -1, limit: int = 100, wait: float = 0.0,
                      tenant: str | None = None) -> tuple[list[dict], int | None, str]:
        """The values the run emitted (`ctx.emit`) after seq `after`, as its ops; with `wait`, up to
        that long for one if none is there yet. Also the seq to ask after next while more are
        there (None: none are left now), and the run's status."""
        reply = await self._ask(run_id, Kind.FLOW_STEPS, {"run_id": run_id, "tenant": tenant or self.tenant,
                                                          "after": after, "limit": limit, "only": "emit",
                                                          "wait": wait}, timeout=self.timeout + wait, polls=wait)
        return reply.get("ops") or [], reply.get("next_after"), reply.get("status", "")

    async def cancel(self, run_id: str, tenant: str | None = None) -> dict:
        return await self._ask(run_id, Kind.FLOW_CANCEL, {"run_id": run_id, "tenant": tenant or self.tenant})

    async def attributes(self, run_id: str, keys: list[str] | None = None, tenant: str | None = None) -> dict:
        body: dict[str, Any] = {"run_id": run_id, "tenant": tenant or self.tenant}
        if keys:
            body["keys"] = keys
        return (await self._ask(run_id, Kind.ATTR_GET, body))["values"]

    async def update(self, run_id: str, key: str, handler: str, arg: Any = None, tenant: str | None = None) -> Any:
        """Run update handler `handler` on attribute `key` under the run's lock; its new value."""
        body = {"run_id": run_id, "tenant": tenant or self.tenant, "key": key, "handler": handler, "arg": arg}
        return (await self._ask(run_id, Kind.ATTR_UPDATE, body, timeout=self.timeout * 2))["values"][key]

    async def broadcast(self, channel: str, message: Any = None, tenant: str | None = None, key: str | None = None,
                        flow: str | None = None, where: dict[str, Any] | None = None) -> int:
        """Publish `message` to `channel` of every run of the tenant waiting on it now (of `flow`,
        with the attributes `where` names); how many took it, each durably. A run that is not
        waiting on it does not get it. With `key`, a run takes it once: after an error (some
        actors may have delivered it), send it again with the same key to reach the rest."""
        body: dict[str, Any] = {"tenant": tenant or self.tenant, "channel": channel, "message": message,
                                **({"key": key} if key is not None else {}), **({"flow": flow} if flow else {}),
                                **({"where": where} if where else {})}
        return sum(reply["delivered"] for reply in await self._ask_every_actor(Kind.CHANNEL_BROADCAST, body))

    async def waiting(self, channel: str, tenant: str | None = None, flow: str | None = None,
                      where: dict[str, Any] | None = None, limit: int = 100) -> tuple[int, list[dict]]:
        """The runs a broadcast to `channel` would reach now: how many, and the `limit` that have
        waited longest ({run_id, flow, since}), those first."""
        body: dict[str, Any] = {"tenant": tenant or self.tenant, "channel": channel, "limit": limit,
                                **({"flow": flow} if flow else {}), **({"where": where} if where else {})}
        replies = await self._ask_every_actor(Kind.CHANNEL_WAITING, body)
        runs = sorted((run for reply in replies for run in reply["runs"]), key=lambda run: run["since"])
        return sum(reply["count"] for reply in replies), runs[:limit]

    async def _ask_every_actor(self, kind: Kind, body: dict[str, Any]) -> list[dict]:
        """Every actor's answer (a tenant's runs are on all of them); the first error once all
        have answered, so none is still at work when its caller hears of it."""
        replies = await asyncio.gather(*(self._ask("", kind, body, actor=f"actor/{i}") for i in range(self.shards)),
                                       return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def publish(self, run_id: str, channel: str, message: Any = None, tenant: str | None = None,
                      key: str | None = None) -> None:
        """Publish `message` to the run's `channel`; with `key`, the run takes one message per key
        (sent again after a lost answer, it is not taken twice)."""
        await self._ask(run_id, Kind.CHANNEL_PUBLISH, {"run_id": run_id, "tenant": tenant or self.tenant,
                                                       "channel": channel, "message": message,
                                                       **({"key": key} if key is not None else {})})
