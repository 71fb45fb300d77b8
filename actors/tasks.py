"""Work for workers, and durable timers: the scheduler's queues, as pure logic (no I/O).

Workers announce what they can run (flows, tools, update handlers) and how many free slots they
have. A task waits in the queue of its capability (`flow:order`, `tool:search`, `update:incr`)
until a worker with that capability has a free slot; then it is offered to that worker. A worker
that is full after all declines, and the task goes back to the front of its queue: a decline
never spends an attempt. A flow run has at most one queued task: a newer submission for the same
run replaces the older one (its execution was superseded).

A tool call or an update handler whose worker left or died goes back to the front of its
queue at once, for the next worker that has it (a deploy's new worker, say), not after its
actor's watchdog; if none comes within `HANDED_BACK_GRACE_SECS`, it fails, as a new one no live
worker has does at once. A flow run's execution goes back to its actor instead (`lost`), which
counts it against the run.

The queue itself is not the durable part: every queued task belongs to a run or a turn whose
journal is durable, and its actor submits it again if it does not start (after a scheduler
restart, or a worker that died). The same holds for timers: actors set them again from their
journals, and fire overdue ones themselves if the scheduler's notice never came.
"""
from __future__ import annotations

import collections
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

Offer = tuple[str, dict]  # (worker, task)
HANDED_BACK_GRACE_SECS = 30.0   # a tool call or update handed back waits this long for a worker that has it (a deploy's)


@dataclass
class WorkerInfo:
    name: str
    capabilities: set[str]
    slots: int
    incarnation: int
    last_seen: float
    assigned: dict[str, float] = field(default_factory=dict)   # task id -> when offered
    tool_schemas: list = field(default_factory=list)
    draining: bool = False   # stopping: no slot for new tasks while those it runs end
    since: float = 0.0       # when this incarnation first said hello

    @property
    def free(self) -> int:
        return self.slots - len(self.assigned)


def capability(task: dict) -> str:
    return f"{task['kind']}:{task['name']}"


def _queue_key(task: dict) -> str:
    return f"run:{task['run_id']}" if task.get("kind") == "flow" and task.get("run_id") else task["task_id"]


class TaskBoard:
    def __init__(self, worker_timeout_secs: float = 3.0, offer_grace_secs: float = 2.0) -> None:
        self.worker_timeout = worker_timeout_secs
        self.offer_grace = offer_grace_secs
        self.workers: dict[str, WorkerInfo] = {}
        self.queues: dict[str, collections.OrderedDict[str, dict]] = {}
        self.tasks: dict[str, tuple[str, dict]] = {}            # task id -> (worker, task)
        self._rotation: collections.deque[str] = collections.deque()
        self.lost: list[tuple[str, dict, bool]] = []   # (worker, flow task, it left): for the scheduler to report
        self.handed_back: dict[str, tuple[float, dict]] = {}   # tool or update task id -> (when its worker went, task)
        self.cancelled: set[str] = set()          # ids of tasks cancelled while with a worker: not handed back
        self.offered_total = 0

    # -- workers -----------------------------------------------------------------------------

    def hello(self, worker: str, capabilities: list[str], slots: int, running: list[str], incarnation: int,
              now: float, tool_schemas: list | None = None, draining: bool = False) -> list[Offer]:
        """A worker's periodic announcement: what it runs, its slots, and the tasks it is running."""
        info = self.workers.get(worker)
        if info is None or info.incarnation != incarnation:
            if info is not None:
                self._forget(info, now)
            info = self.workers[worker] = WorkerInfo(worker, set(capabilities), slots, incarnation, now, since=now)
            self._rotation.append(worker)
        info.capabilities = set(capabilities)
        info.slots = slots
        info.last_seen = now
        info.tool_schemas = tool_schemas or []
        info.draining = draining
        still = set(running)
        for task_id, offered_at in list(info.assigned.items()):
            # Not running and offered a while ago: it finished (its done notice was lost) or
            # never arrived; either way its actor submits it again if it matters.
            if task_id not in still and now - offered_at > self.offer_grace:
                del info.assigned[task_id]
                self.tasks.pop(task_id, None)
                self.cancelled.discard(task_id)
        self._adopt(info, still, now)
        return self._match(now)

    def _adopt(self, info: WorkerInfo, running: set[str], now: float) -> None:
        """A worker taken for gone (stalled past its timeout) comes back still running tasks that
        were queued again meanwhile: they are its, not offered to it again (it would decline
        each while it runs it, and run it once more after it finished)."""
        for task_id in running:
            if task_id in self.tasks:
                continue
            for cap, queue in self.queues.items():
                task = queue.get(task_id)   # (a tool's or update's key is its id; a run's is not)
                if task is not None and task["task_id"] == task_id:
                    del queue[task_id]
                    if not queue:
                        del self.queues[cap]
                    self.handed_back.pop(task_id, None)
                    info.assigned[task_id] = now
                    self.tasks[task_id] = (info.name, task)
                    break

    def leave(self, worker: str, incarnation: int, now: float) -> bool:
        """A worker that says it stops: gone now. `lost` holds the flow tasks it had been given;
        its other tasks wait first in their queues (`offers`). False if this incarnation of it is
        not known (it left already, or a new one said hello since)."""
        info = self.workers.get(worker)
        if info is None or info.incarnation != incarnation:
            return False
        self._forget(info, now, left=True)
        return True

    def stalled(self, now: float) -> None:
        """The scheduler did not run for a while: its workers' hellos meanwhile waited or bounced,
        and their silence says nothing (each would have been taken for dead, its tasks lost)."""
        for info in self.workers.values():
            info.last_seen = now

    def expire(self, now: float) -> list[str]:
        """Workers silent too long are gone, as in `leave`; returns their names."""
        gone = [w for w in self.workers.values() if now - w.last_seen > self.worker_timeout]
        for info in gone:
            self._forget(info, now)
        return [info.name for info in gone]

    def _forget(self, info: WorkerInfo, now: float, left: bool = False) -> None:
        del self.workers[info.name]
        if info.name in self._rotation:
            self._rotation.remove(info.name)
        for task_id in info.assigned:
            held = self.tasks.pop(task_id, None)
            if held is None:
                continue
            task = held[1]
            if task.get("kind") == "flow":
                self.lost.append((*held, left))
            elif task_id not in self.cancelled:
                queue = self.queues.setdefault(capability(task), collections.OrderedDict())
                queue[_queue_key(task)] = task
                queue.move_to_end(_queue_key(task), last=False)
                self.handed_back.setdefault(task_id, (now, task))
            self.cancelled.discard(task_id)

    def offers(self, now: float) -> list[Offer]:
        """What can be offered now (after workers went: the tasks they handed back)."""
        return self._match(now)

    def stranded(self, now: float) -> list[dict]:
        """Tasks handed back that no live worker has had a place for since `HANDED_BACK_GRACE_SECS`:
        out of their queue, for the scheduler to fail."""
        out = []
        for task_id, (since, task) in list(self.handed_back.items()):
            if now - since < HANDED_BACK_GRACE_SECS:
                continue
            del self.handed_back[task_id]   # (one a live worker has waits in its queue like any other)
            queue = self.queues.get(capability(task))
            if queue is not None and _queue_key(task) in queue and not self.offered(task):
                del queue[_queue_key(task)]
                if not queue:
                    del self.queues[capability(task)]
                out.append(task)
        return out

    def handed_back_waits(self, task: dict[str, Any]) -> bool:
        """Is this task one its worker handed back, waiting for the next (its actor sent it again)?"""
        return task["task_id"] in self.handed_back

    def tools(self) -> dict[str, dict]:
        """Tool schemas advertised by live workers, by tool name."""
        out: dict[str, dict] = {}
        for info in self.workers.values():
            for schema in info.tool_schemas:
                name = (schema.get("function") or {}).get("name") if isinstance(schema, dict) else None
                if name:
                    out[name] = schema
        return out

    # -- tasks -------------------------------------------------------------------------------

    def offered(self, task: dict[str, Any]) -> bool:
        """Does any live worker say it can run this task?"""
        cap = capability(task)
        return any(cap in info.capabilities for info in self.workers.values())

    def submit(self, task: dict[str, Any], now: float) -> list[Offer]:
        if task["task_id"] in self.tasks:
            return []  # already with a worker: a re-submission of the same task
        self.queues.setdefault(capability(task), collections.OrderedDict())[_queue_key(task)] = task
        return self._match(now)

    def decline(self, worker: str, task_id: str, now: float) -> list[Offer]:
        """A full worker gave the task back: it goes to the front of its queue, no attempt spent."""
        task = self._release(worker, task_id)
        if task is not None:
            queue = self.queues.setdefault(capability(task), collections.OrderedDict())
            key = _queue_key(task)
            queue[key] = task
            queue.move_to_end(key, last=False)
            info = self.workers.get(worker)
            if info is not None:
                info.last_seen = now
        return self._match(now, skip=worker)

    def cancel(self, task_id: str) -> str | None:
        """Drop a queued task; for one already offered, the worker that has it (to be told)."""
        assigned = self.tasks.get(task_id)
        if assigned is not None:
            self.cancelled.add(task_id)
            return assigned[0]
        self.handed_back.pop(task_id, None)
        for cap, queue in list(self.queues.items()):
            for key, task in list(queue.items()):
                if task["task_id"] == task_id:
                    del queue[key]
            if not queue:
                del self.queues[cap]

    def done(self, worker: str, task_id: str, now: float) -> list[Offer]:
        self._release(worker, task_id)
        return self._match(now)

    def _release(self, worker: str, task_id: str) -> dict | None:
        entry = self.tasks.get(task_id)
        if entry is None or entry[0] != worker:
            return None
        del self.tasks[task_id]
        self.cancelled.discard(task_id)
        info = self.workers.get(worker)
        if info is not None:
            info.assigned.pop(task_id, None)
        return entry[1]

    def _match(self, now: float, skip: str | None = None) -> list[Offer]:
        offers: list[Offer] = []
        for cap in list(self.queues):
            queue = self.queues[cap]
            while queue:
                worker = self._pick(cap, skip)
                if worker is None:
                    break
                _, task = queue.popitem(last=False)
                self.handed_back.pop(task["task_id"], None)
                worker.assigned[task["task_id"]] = now
                self.tasks[task["task_id"]] = (worker.name, task)
                offers.append((worker.name, task))
            if not queue:
                del self.queues[cap]
        self.offered_total += len(offers)
        return offers

    def _pick(self, cap: str, skip: str | None) -> WorkerInfo | None:
        """The next worker in rotation with this capability and a free slot."""
        for _ in range(len(self._rotation)):
            name = self._rotation[0]
            self._rotation.rotate(-1)
            info = self.workers.get(name)
            if info is not None and name != skip and info.free > 0 and cap in info.capabilities:
                return info
        return None

    def workers_view(self, now: float) -> list[dict[str, Any]]:
        """Each live worker as `GET /v1/workers` lists it."""
        out = []
        for info in sorted(self.workers.values(), key=lambda w: w.name):
            names: dict[str, list[str]] = {"flow": [], "tool": [], "update": []}
            for cap in info.capabilities:
                kind, _, name = cap.partition(":")
                names.setdefault(kind, []).append(name)
            out.append({"name": info.name, "flows": sorted(names["flow"]), "tools": sorted(names["tool"]),
                        "update_handlers": sorted(names["update"]), "slots": info.slots,
                        "running": len(info.assigned), "draining": info.draining,
                        "up_secs": round(now - info.since, 1), "seen_secs_ago": round(now - info.last_seen, 1)})
        return out

    def gauges(self) -> dict[str, dict[str, int]]:
        """What the scheduler's metrics say of workers, their slots and the tasks waiting for them."""
        serving = [w for w in self.workers.values() if not w.draining]
        waiting = {"flow": 0, "tool": 0, "update": 0}
        for cap, queue in self.queues.items():
            kind = cap.partition(":")[0]
            waiting[kind] = waiting.get(kind, 0) + len(queue)
        return {"workers": {"serving": len(serving), "draining": len(self.workers) - len(serving)},
                "slots": {"busy": sum(min(len(w.assigned), w.slots) for w in serving),
                          "free": sum(max(0, w.free) for w in serving)},
                "waiting": waiting}

    def stats(self) -> dict[str, Any]:
        return {"workers": len(self.workers), "worker_names": sorted(self.workers),
                "queued": sum(len(q) for q in self.queues.values()),
                "assigned": len(self.tasks), "free_slots": sum(max(0, w.free) for w in self.workers.values()),
                "offered_total": self.offered_total}


class Timers:
    """Timers by due time (UNIX seconds); setting one again with the same id is harmless."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, str]] = []
        self.timers: dict[str, tuple[str, str, float]] = {}   # id -> (actor, run_id, due)

    def set(self, timer_id: str, actor: str, run_id: str, due: float) -> None:
        if not math.isfinite(due):   # a NaN on top of the heap would hold back every timer behind it
            return
        known = self.timers.get(timer_id)
        self.timers[timer_id] = (actor, run_id, due)
        if known is None or known[2] != due:
            heapq.heappush(self.heap, (due, timer_id))

    def due(self, now: float) -> list[tuple[str, str, str]]:
        """(actor, timer_id, run_id) of every timer due by `now`, each once."""
        out = []
        while self.heap and self.heap[0][0] <= now:
            due, timer_id = heapq.heappop(self.heap)
            entry = self.timers.get(timer_id)
            if entry is None or entry[2] != due:
                continue
            del self.timers[timer_id]
            out.append((entry[0], timer_id, entry[1]))
        return out

    def __len__(self) -> int:
        return len(self.timers)
