"""`agent-os worker MODULE ...`: runs user code — flows, tools, attribute-update handlers.

A worker imports the modules it is given, takes the `App` each one defines (attribute `app`, or
`MODULE:NAME`), announces what it can run and how many slots it has to the scheduler every
second, and runs the tasks it is offered. A task offered while every slot is busy is declined
and goes to another worker without spending an attempt. Every second it also tells each actor
which of its runs and tasks are still running, so a worker that dies is noticed in seconds.

The worker holds no durable state: a flow's journal lives with its actor, and a killed worker's
executions are dispatched again elsewhere (a step it was in spends one attempt). Stopped
(SIGTERM, Ctrl-C), it cuts its steps short as interrupted, which spends no attempt, and says
goodbye; with `--drain SECS` it first takes no new task and lets those it runs end (`drain`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from agentos.config import Config
from actors.flow_context import FlowContext
from actors.flow_types import Superseded, Suspended, check_encodable
from actors.sdk import App
from actors.worker_apps import load_app, merge
from broker.client import Bus, BusError
from broker.sharding import SCHEDULER
from broker.protocol import BROKER, Kind, Message
from broker.address import bus_address

REQUEST_TIMEOUT_SECS = 300.0
REACH_TIMEOUT_SECS = 10.0        # how long a worker waits for the server's broker before it says it has none
STOP_REPORT_SECS = 1.0           # how long a stopping worker waits for its steps to report themselves interrupted


class SlotThreads:
    """Where plain (not async) steps, tools and handlers run: at most one call per slot at once
    (asyncio's default pool, cpu count + 4 threads, ran only a few of a worker's blocking steps at
    once), counted, so that a stopping worker need not wait for them (see `main`).

    A thread cannot be stopped: a call whose caller gave up on it (a step past its timeout, a
    cancelled run) runs on to its end, its slot free for the next call. So that such a thread
    does not take a slot's thread with it — the next attempt queued behind it and timed out
    without starting — the pool has a spare thread per slot for them; past that many at once,
    new calls wait for a thread again, and the log says to restart the worker."""

    def __init__(self, slots: int, log: logging.Logger | None = None) -> None:
        self.slots = slots
        self.pool = ThreadPoolExecutor(2 * slots, thread_name_prefix="slot")
        self.gate: asyncio.Semaphore | None = None   # made on the worker's loop, at the first call
        self.lock = threading.Lock()
        self.busy = 0           # calls on a thread, abandoned ones too
        self.abandoned = 0      # calls still running whose callers gave up
        self.log = log or logging.getLogger("agent-os.worker")

    async def call(self, fn: Callable[[], Any]) -> Any:
        if self.gate is None:
            self.gate = asyncio.Semaphore(self.slots)
        state = {"ended": False, "left": False}

        def job() -> Any:
            try:
                return fn()
            finally:
                with self.lock:
                    self.busy -= 1
                    state["ended"] = True
                    if state["left"]:
                        self.abandoned -= 1

        async with self.gate:
            with self.lock:
                self.busy += 1
            work = self.pool.submit(job)
            try:
                return await asyncio.wrap_future(work)
            except asyncio.CancelledError:
                if work.cancel():           # it had not started, and now never will
                    with self.lock:
                        self.busy -= 1
                    raise
                with self.lock:
                    if not state["ended"]:
                        state["left"] = True
                        self.abandoned += 1
                    abandoned = self.abandoned
                if state["left"]:
                    self.log.warning("a blocking call runs on past its caller (a timeout or a cancel); %d such "
                                     "thread(s) now%s", abandoned,
                                     "" if abandoned <= self.slots else
                                     f", more than the {self.slots} spare ones: calls wait for a thread — "
                                     "restart this worker")
                raise


class WorkerRuntime:
    def __init__(self, app: App, bus: Bus, slots: int, log: logging.Logger) -> None:
        self.app = app
        self.bus = bus
        self.slots = slots
        self.log = log
        self.threads = SlotThreads(slots, log)
        self.running: dict[str, tuple[dict, asyncio.Task]] = {}
        self.stopping = False   # its steps cancelled now are interrupted, not failed (actors/sdk.py)
        self.draining = False   # stopping soon: it takes no new task, and lets those it runs go on a while
        bus.on(Kind.TASK_OFFER, self.on_offer)
        bus.on(Kind.TASK_CANCEL, self.on_cancel)

    # -- tasks ----------------------------------------------------------------------------------

    def on_offer(self, msg: Message) -> None:
        task = msg.body
        if len(self.running) >= self.slots or task["task_id"] in self.running or self.draining:
            self.bus.send(SCHEDULER, Kind.TASK_DECLINE, {"task_id": task["task_id"]})
            return
        runner = {"flow": self.run_flow, "tool": self.run_tool, "update": self.run_update}.get(task["kind"])
        if runner is None:
            self.bus.send(SCHEDULER, Kind.TASK_DECLINE, {"task_id": task["task_id"]})
            return
        running = asyncio.ensure_future(self._run(runner, task))
        # On the task, not in _run's `finally`: a cancel that comes before its first step (the
        # offer and the cancel in one batch) never enters _run, and the slot would stay taken.
        running.add_done_callback(lambda _: self._ended(task["task_id"]))
        self.running[task["task_id"]] = (task, running)

    def on_cancel(self, msg: Message) -> None:
        """Its turn or run was cancelled: stop it (a sync function in a thread runs to its end)."""
        entry = self.running.get(msg.body["task_id"])
        if entry is not None:
            entry[1].cancel()

    async def _run(self, runner, task: dict) -> None:
        try:
            await runner(task)
        except (Superseded, Suspended, asyncio.CancelledError):
            pass
        except Exception:
            self.log.exception("task %s (%s %s) failed in the worker", task["task_id"], task["kind"], task["name"])

    def _ended(self, task_id: str) -> None:
        self.running.pop(task_id, None)
        if not self.stopping:   # (stopping, its goodbye says it for all: their runs hear at once to go on elsewhere)
            self.bus.send(SCHEDULER, Kind.TASK_DONE, {"task_id": task_id})

    async def run_flow(self, task: dict) -> None:
        fn = self.app.flows.get(task["name"])
        payload = task.get("payload") or {}
        ctx = FlowContext(self, task["run_id"], task["exec"], payload.get("input"), payload.get("journal") or [],
                          payload.get("attrs") or {}, task.get("tenant"))
        ctx._actor = task["actor"]
        try:
            if fn is None:
                raise LookupError(f"this worker has no flow named {task['name']!r}")
            result = await fn(ctx, payload.get("input"))
            check_encodable(result, f"the result of flow {task['name']!r}", json=True)   # else the run retried for ever
            body = {"ok": True, "result": result}
        except Superseded:
            return
        except Suspended:   # parked: a step run beside what parked (asyncio.gather) ends first, its outcome sent
            await ctx.settled()
            return
        except Exception as exc:  # the flow raised: the run fails with its error
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        await ctx.settled()   # (a step left running beside a branch that failed, or not awaited)
        if ctx._results_due:
            body["results_due"] = sorted(ctx._results_due)
        await self._request(task["actor"], Kind.FLOW_COMPLETE, {"run_id": task["run_id"], "exec": task["exec"], **body},
                            task["run_id"])

    async def run_tool(self, task: dict) -> None:
        tool = self.app.tools.get(task["name"])
        payload = task.get("payload") or {}
        try:
            if tool is None:
                raise LookupError(f"this worker has no tool named {task['name']!r}")
            arguments = payload.get("arguments") or {}
            result = (await _call(self.threads, tool.fn, **arguments) if isinstance(arguments, dict)
                      else await _call(self.threads, tool.fn, arguments))
            check_encodable(result, f"the result of tool {task['name']!r}", json=True)
            body = {"ok": True, "result": result}
        except Exception as exc:  # reported to the turn, which shows it to the model
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        await self._request(task["actor"], Kind.TASK_RESULT, {"task_id": task["task_id"], **body}, task.get("run_id", ""))

    async def run_update(self, task: dict) -> None:
        handler = self.app.updates.get(task["name"])
        payload = task.get("payload") or {}
        try:
            if handler is None:
                raise LookupError(f"this worker has no update handler named {task['name']!r}")
            result = await _call(self.threads, handler, payload.get("value"), payload.get("arg"))
            check_encodable(result, f"the result of update handler {task['name']!r}", json=True)
            body = {"ok": True, "result": result}
        except Exception as exc:
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        await self._request(task["actor"], Kind.TASK_RESULT, {"task_id": task["task_id"], **body}, task.get("run_id", ""))

    async def _request(self, actor: str, kind: Kind, body: dict, session: str) -> Message:
        try:
            reply = await self.bus.request(actor, kind, body, timeout=REQUEST_TIMEOUT_SECS, attempt_secs=5.0,
                                           session=session)
        except BusError as exc:
            self.log.warning("%s to %s not acknowledged: %s", kind, actor, exc)
            raise Superseded from None
        if reply.kind is Kind.FLOW_ACK and not reply.body["ok"] and reply.body.get("code") == "superseded":
            raise Superseded
        return reply

    # -- what FlowContext calls -----------------------------------------------------------------

    async def step_start(self, ctx: FlowContext, fields: dict[str, Any]) -> dict[str, Any]:
        if ctx._results_due:
            fields = {**fields, "results_due": sorted(ctx._results_due)}
        reply = await self._request(ctx._actor, Kind.STEP_START, {"run_id": ctx._id, "exec": ctx._exec, **fields},
                                    ctx._id)
        return reply.body

    async def step_result(self, ctx: FlowContext, seq: int, attempt: int, ok: bool, **fields: Any) -> None:
        await self._request(ctx._actor, Kind.STEP_RESULT, {"run_id": ctx._id, "exec": ctx._exec, "seq": seq,
                                                           "attempt": attempt, "ok": ok, **fields}, ctx._id)

    def step_result_nowait(self, ctx: FlowContext, seq: int, attempt: int, ok: bool, **fields: Any) -> None:
        """An ASYNC step's result: the flow goes on at once, but it is sent until the actor takes
        it. Sent once, the broker bounced it to an actor stalled past its peer timeout: the run's
        journal kept a hole there, and its next execution ran the step again."""
        def done(_reply: Message | None, exc: BaseException | None) -> None:
            ctx._results_due.discard(seq)
            if exc is not None:
                self.log.warning("the result of step %d of run %s not acknowledged: %s", seq, ctx._id, exc)
        ctx._results_due.add(seq)   # named in the run's next requests: it must not park or end before this
        self.bus.request_callback(ctx._actor, Kind.STEP_RESULT, {"run_id": ctx._id, "exec": ctx._exec, "seq": seq,
                                                                 "attempt": attempt, "ok": ok, "sync": False, **fields},
                                  done, timeout=REQUEST_TIMEOUT_SECS, attempt_secs=5.0, session=ctx._id)

    def heartbeat(self, ctx: FlowContext, seq: int, attempt: int, value: Any) -> None:
        self.bus.send(ctx._actor, Kind.STEP_HEARTBEAT, {"run_id": ctx._id, "exec": ctx._exec, "seq": seq,
                                                        "attempt": attempt, "value": value}, session=ctx._id)

    # -- announcements ---------------------------------------------------------------------------

    def hello(self) -> None:
        body = {"slots": 0 if self.draining else self.slots, "running": list(self.running),
                "incarnation": self.bus.incarnation,
                "flows": list(self.app.flows), "tools": list(self.app.tools), "handlers": list(self.app.updates),
                "tool_schemas": [t.schema() for t in self.app.tools.values()]}
        if self.draining:
            body["draining"] = True
        self.bus.send(SCHEDULER, Kind.WORKER_HELLO, body)

    def alive(self) -> None:
        by_actor: dict[str, dict[str, list]] = {}
        for task, _ in self.running.values():
            entry = by_actor.setdefault(task["actor"], {"runs": [], "tasks": []})
            if task["kind"] == "flow":
                entry["runs"].append([task["run_id"], task["exec"]])
            else:
                entry["tasks"].append(task["task_id"])
        for actor, body in by_actor.items():
            self.bus.send(actor, Kind.WORKER_ALIVE, body)

    async def announce(self) -> None:
        while True:
            self.hello()
            self.alive()
            await asyncio.sleep(1.0)


async def _call(threads: SlotThreads, fn, *args: Any, **kwargs: Any) -> Any:
    if asyncio.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    return await threads.call(lambda: fn(*args, **kwargs))


async def say_when_reached(bus: Bus, address: str, storage_dir: str, log: logging.Logger,
                           timeout: float = REACH_TIMEOUT_SECS) -> None:
    """Log once the server's broker answers, and warn while it does not: a worker pointed at a
    bus no server listens on (an ipc address made from a relative storage.dir read in another
    directory, a wrong host) would otherwise wait in silence, its hellos lost."""
    unanswered = 0
    while True:
        try:
            await bus.request(BROKER, Kind.PEERS, {}, timeout=timeout, attempt_secs=min(2.0, timeout))
        except BusError:
            unanswered += 1
            if unanswered == 1 or unanswered % 6 == 0:
                hint = ("; an ipc address is the server's run directory, named after its storage.dir as "
                        f"resolved where it started (here: {storage_dir}): start the worker from that "
                        "directory, or give both an absolute storage.dir or kernel.run_dir"
                        if address.startswith("ipc://") else "")
                log.warning("no answer from an agent-os server at %s for %.0f s%s", address, unanswered * timeout,
                            hint)
            continue
        log.info("reached the server at %s", address)
        return


async def drain(runtime: WorkerRuntime, stop: asyncio.Event, secs: float, log: logging.Logger) -> None:
    """Take no new task (its hellos say no free slot; an offer already sent is declined, to go to
    another worker) and give those running up to `secs` to end: a deploy need not cut a long step
    short. A second signal ends the wait at once."""
    runtime.draining = True
    runtime.hello()
    stop.clear()   # (the signal handlers set it again)
    log.info("draining: %d step(s) and task(s) in flight, up to %gs to end (signal again to stop at once)",
             len(runtime.running), secs)
    deadline = time.monotonic() + secs
    while runtime.running and not stop.is_set() and time.monotonic() < deadline:
        try:
            await asyncio.wait_for(stop.wait(), min(0.1, max(0.0, deadline - time.monotonic())))
        except asyncio.TimeoutError:
            pass
    if runtime.running:
        log.info("drain over (%s) with %d still in flight", "signalled again" if stop.is_set() else "time is up",
                 len(runtime.running))
    else:
        log.info("drained: nothing in flight")


def main(config: Config, modules: list[str], slots: int, name: str | None, log: logging.Logger,
         drain_secs: float = 0.0) -> int:
    from agentos import service
    from agentos.rundir import RunDir

    sys.path.insert(0, os.getcwd())
    app = merge([load_app(spec) for spec in modules])
    run_dir = RunDir.for_config(config)
    worker_name = name or f"worker/{socket.gethostname()}-{os.getpid()}"
    service.set_title(worker_name)

    runtimes: list[WorkerRuntime] = []

    async def run(stop: asyncio.Event) -> int:
        address = bus_address(config, run_dir)
        bus = Bus(worker_name, address, role="worker", heartbeat_secs=config.broker.heartbeat_secs, log=log,
                  spill_bytes=config.broker.spill_ring_bytes)
        runtime = WorkerRuntime(app, bus, slots, log)
        runtimes.append(runtime)
        await bus.start()
        announcer = service.lifelong(runtime.announce())
        reach = asyncio.ensure_future(say_when_reached(bus, address.endpoint, os.path.abspath(config.storage.dir),
                                                       log))
        log.info("worker %s: %d slots; flows %s, tools %s, update handlers %s", worker_name, slots,
                 sorted(app.flows), sorted(app.tools), sorted(app.updates))
        await stop.wait()
        if drain_secs > 0 and runtime.running:
            await drain(runtime, stop, drain_secs, log)
        log.info("worker %s stopping: %d step(s) and task(s) in flight cancelled, their runs retry them elsewhere",
                 worker_name, len(runtime.running))
        announcer.cancel()
        reach.cancel()
        runtime.stopping = True
        cancelled = [task for _, task in runtime.running.values()]
        for task in cancelled:
            task.cancel()
        if cancelled:   # each tells its run the attempt was cut short (a second at most: an actor may be down)
            await asyncio.wait(cancelled, timeout=STOP_REPORT_SECS)
        try:   # the scheduler forgets it now, and its runs retry their tasks elsewhere without waiting
            await bus.request(SCHEDULER, Kind.WORKER_BYE, {"incarnation": bus.incarnation}, timeout=1.0)
        except BusError:
            pass   # (no scheduler now: it takes the silence for the stop, as it would a crash)
        await bus.close()
        return service.EXIT_OK

    code = service.run(run, interrupt=True)   # in a terminal of its own: Ctrl-C stops it
    busy = runtimes[0].threads.busy if runtimes else 0
    if busy:
        # A thread cannot be stopped, and the interpreter would wait for it at exit — an hour for
        # an hour-long blocking step. Their runs go on elsewhere (the steps were not committed).
        log.warning("stopping with %d blocking step(s) still on their threads; their runs retry them elsewhere", busy)
        logging.shutdown()
        os._exit(code)
    return code
