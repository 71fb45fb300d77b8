"""The scheduler role: provider permits, work queues for workers, and durable timers.

It never calls the provider and never runs user code; it only decides who may and who does.
State lives in `PermitPool` (permits), `TaskBoard` and `Timers` (actors/tasks.py); this module
wires them to the bus and keeps the gauges current.
"""
from __future__ import annotations

import asyncio
import logging
import time

from agentos import metrics, service
from agentos.config import Config
from agentos.rundir import RunDir
from actors.flow_queues import QueueGrant, QueuePools, parse_queues
from actors.permits import Grant, PermitPool
from actors.tasks import HANDED_BACK_GRACE_SECS, Offer, TaskBoard, Timers
from broker.client import Bus
from broker.sharding import SCHEDULER
from broker.protocol import Kind, Message
from broker.address import bus_address



def _backoff_secs(body: dict) -> float:
    backoff = float(body.get("backoff_secs") or 0.0)
    return min(backoff, 300.0) if backoff == backoff else 0.0   # NaN: no pause; inf is capped like any long one


class Scheduler:
    def __init__(self, config: Config, log: logging.Logger) -> None:
        self.pool = PermitPool(limit=config.kernel.concurrency_limit)
        self.log = log
        self.bus: Bus | None = None
        self.backoffs = 0
        self.trace_ids: dict[str, tuple[str, str]] = {}  # permit -> (session, turn), for the trace tap
        self.board = TaskBoard()
        self.timers = Timers()
        self.started = time.monotonic()
        self.queues = QueuePools(parse_queues(config.kernel.flow_queues), self.started)

    def handlers(self) -> dict:
        return {Kind.PERMIT_REQUEST: self.on_request, Kind.PERMIT_RELEASE: self.on_release,
                Kind.PERMIT_SYNC: self.on_sync, Kind.STATS: self.on_stats,
                Kind.TASK_SUBMIT: self.on_submit, Kind.TASK_DECLINE: self.on_decline, Kind.TASK_DONE: self.on_done,
                Kind.WORKER_HELLO: self.on_worker_hello, Kind.WORKER_BYE: self.on_worker_bye,
                Kind.TIMER_SET: self.on_timer_set,
                Kind.TOOLS_LIST: self.on_tools_list, Kind.TASK_CANCEL: self.on_cancel,
                Kind.QUEUE_REQUEST: self.on_queue_request, Kind.QUEUE_RELEASE: self.on_queue_release,
                Kind.QUEUE_SYNC: self.on_queue_sync}

    def on_cancel(self, msg: Message) -> None:
        worker = self.board.cancel(msg.body["task_id"])
        if worker is not None:
            self.bus.send(worker, Kind.TASK_CANCEL, {"task_id": msg.body["task_id"]})

    def on_tools_list(self, msg: Message) -> None:
        self.bus.reply(msg, Kind.TOOLS, {"tools": list(self.board.tools().values())})

    # -- tasks and timers ---------------------------------------------------------------------

    def _offer(self, offers: list[Offer]) -> None:
        for worker, task in offers:
            body = {k: task[k] for k in ("task_id", "kind", "name", "actor", "run_id", "exec", "payload", "tenant")
                    if task.get(k) is not None}
            self.bus.send(worker, Kind.TASK_OFFER, body, session=task.get("run_id") or "")

    def on_submit(self, msg: Message) -> None:
        task = {**msg.body, "actor": msg.src}
        if (task.get("kind") in ("update", "tool") and not self.board.offered(task)
                and not self.board.handed_back_waits(task)
                and time.monotonic() - self.started > self.board.worker_timeout):  # workers have said hello
            # An update is a caller waiting with the run's lock held, a tool a model that named one
            # no worker has (they do make names up): either fails now, not after its timeout. (A
            # flow run waits in its queue for a worker that has its flow; a task whose worker went
            # waits in its queue a while for the next: actors/tasks.py.)
            self._fail(task, "")
            return
        self._offer(self.board.submit(task, time.monotonic()))

    def _fail(self, task: dict, why: str) -> None:
        what = "an update handler" if task["kind"] == "update" else "a tool"
        self.bus.send(task["actor"], Kind.TASK_RESULT, {"task_id": task["task_id"], "ok": False,
                                                        "error": f"no worker has {what} named {task['name']!r}{why}"},
                      session=task.get("run_id") or "")

    def on_decline(self, msg: Message) -> None:
        self._offer(self.board.decline(msg.src, msg.body["task_id"], time.monotonic()))

    def on_done(self, msg: Message) -> None:
        self._offer(self.board.done(msg.src, msg.body["task_id"], time.monotonic()))

    def on_worker_hello(self, msg: Message) -> None:
        b = msg.body
        caps = ([f"flow:{n}" for n in b["flows"]] + [f"tool:{n}" for n in b["tools"]] +
                [f"update:{n}" for n in b["handlers"]])
        self._offer(self.board.hello(msg.src, caps, b["slots"], [str(t) for t in b["running"]], b["incarnation"],
                                     time.monotonic(), b.get("tool_schemas"), bool(b.get("draining"))))

    def on_worker_bye(self, msg: Message) -> None:
        if self.board.leave(msg.src, msg.body["incarnation"], time.monotonic()):   # (the ticker sends TASK_LOST)
            self.log.info("worker %s left; its tasks go to the next worker", msg.src)
            self._offer(self.board.offers(time.monotonic()))
        self.bus.reply(msg, Kind.WORKER_BYE, {"incarnation": msg.body["incarnation"]})

    def on_timer_set(self, msg: Message) -> None:
        self.timers.set(msg.body["timer_id"], msg.src, msg.body["run_id"], float(msg.body["due"]))

    def _send(self, grants: list[Grant]) -> None:
        for holder, permit_id in grants:
            session, turn = self.trace_ids.pop(permit_id, ("", ""))
            self.bus.send(holder, Kind.PERMIT_GRANT, {"permit_id": permit_id}, session=session, turn=turn)

    def on_request(self, msg: Message) -> None:
        b = msg.body
        if msg.session and len(self.trace_ids) < 100_000:
            self.trace_ids[b["permit_id"]] = (msg.session, msg.turn)
        self._send(self.pool.request(b["permit_id"], msg.src, b["tenant"], time.monotonic()))

    def on_release(self, msg: Message) -> None:
        self.trace_ids.pop(msg.body["permit_id"], None)
        backoff = _backoff_secs(msg.body)
        if backoff > 0:
            self.backoffs += 1
            metrics.provider_backoffs.inc()
            self.log.warning("provider asked to back off for %.1fs; pausing grants", backoff)
        self._send(self.pool.release(msg.body["permit_id"], time.monotonic(), backoff))

    def on_sync(self, msg: Message) -> None:
        b = msg.body
        self._send(self.pool.sync(msg.src, b["incarnation"], [str(p) for p in b["held"]],
                                  [str(p) for p in b["waiting"]], time.monotonic(), _backoff_secs(b)))

    # -- flow queues ---------------------------------------------------------------------------

    def _admit(self, grants: list[QueueGrant]) -> None:
        for holder, queue, run_id in grants:
            body = {"queue": queue, "run_id": run_id}
            window = self.queues.window_secs(queue)
            if window:   # the actor reports the admission this long (a new scheduler counts it)
                body["window_secs"] = window
            self.bus.send(holder, Kind.QUEUE_GRANT, body, session=run_id)

    def on_queue_request(self, msg: Message) -> None:
        b = msg.body
        self._admit(self.queues.request(b["queue"], b["run_id"], msg.src, b["tenant"], time.monotonic(),
                                        b.get("priority") or 0))

    def on_queue_release(self, msg: Message) -> None:
        self._admit(self.queues.release(msg.body["queue"], msg.body["run_id"], time.monotonic()))

    def on_queue_sync(self, msg: Message) -> None:
        self._admit(self.queues.sync(msg.src, msg.body["incarnation"], msg.body["queues"], time.monotonic()))

    def on_stats(self, msg: Message) -> None:
        stats = self.pool.stats(time.monotonic())
        stats["backoffs"] = self.backoffs
        stats["tasks"] = self.board.stats()
        if msg.body.get("workers"):   # (the gateway's GET /v1/workers)
            stats["workers"] = self.board.workers_view(time.monotonic())
        stats["timers"] = len(self.timers)
        tenant = msg.body.get("tenant")   # the gateway's GET /v1/queues: that tenant's own runs too
        stats["flow_queues"] = self.queues.stats(time.monotonic(), tenant if isinstance(tenant, str) else None)
        stats["bus"] = self.bus.stats()
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "scheduler", "stats": stats})

    async def ticker(self) -> None:
        last_tick = queues_counted = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if now - last_tick > self.board.worker_timeout / 2:
                self.board.stalled(now)
            last_tick = now
            self._send(self.pool.tick(now))
            self._admit(self.queues.tick(now))
            for gone in self.board.expire(now):
                self.log.warning("worker %s stopped answering; its tasks go to the next worker", gone)
                self._offer(self.board.offers(now))
            for task in self.board.stranded(now):
                self._fail(task, f": its worker went {HANDED_BACK_GRACE_SECS:g}s ago and none has come since")
            for worker, task, left in self.board.lost:
                if task.get("kind") == "flow" and task.get("run_id"):
                    body = {"run_id": task["run_id"], "exec": int(task["exec"]), "worker": worker, "left": left}
                    self.bus.send(task["actor"], Kind.TASK_LOST, body, session=task["run_id"])
            self.board.lost.clear()
            for actor, timer_id, run_id in self.timers.due(time.time()):
                self.bus.send(actor, Kind.TIMER_FIRE, {"timer_id": timer_id, "run_id": run_id}, session=run_id)
            if len(self.trace_ids) > len(self.pool.waiting) + 1000:  # waiters dropped by a sync
                self.trace_ids = {p: ids for p, ids in self.trace_ids.items() if p in self.pool.waiting}
            metrics.permits_in_use.set(len(self.pool.held))
            metrics.permit_queue.set(len(self.pool.waiting))
            if now - queues_counted >= 1.0:   # (a pass over every key's place of a queue per key)
                queues_counted = now
                for name, counts in self.queues.stats(now).items():
                    metrics.flow_queue_running.labels(name).set(counts["running"])
                    metrics.flow_queue_waiting.labels(name).set(counts["waiting"])
                gauges = self.board.gauges()
                for state, n in gauges["workers"].items():
                    metrics.workers.labels(state).set(n)
                for state, n in gauges["slots"].items():
                    metrics.worker_slots.labels(state).set(n)
                for kind, n in gauges["waiting"].items():
                    metrics.tasks_waiting.labels(kind).set(n)


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    async def run(stop: asyncio.Event) -> int:
        scheduler = Scheduler(config, log)
        bus = Bus(SCHEDULER, bus_address(config, run_dir), scheduler.handlers(),
                  heartbeat_secs=config.broker.heartbeat_secs, log=log, spill_bytes=config.broker.spill_ring_bytes)
        scheduler.bus = bus
        await bus.start()
        ticker = service.lifelong(scheduler.ticker())
        log.info("granting up to %d provider permits", config.kernel.concurrency_limit)
        await stop.wait()
        ticker.cancel()
        await bus.close()
        return service.EXIT_OK

    return service.run(run)
