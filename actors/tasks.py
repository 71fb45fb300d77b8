"""Work for workers, and durable timers: the scheduler's queues, as pure logic (no I/O).

Workers announce what they can run (flows, tools, update handlers) and how many free slots they
have. A task waits in the queue of its capability (`flow:order`, `tool:search`, `update:incr`)
until a worker with that capability has a free slot; then it is offered to that worker. A worker
that is full after all declines, and the task goes back to the front of its queue: a decline
never spends an attempt. A flow run has at most one queued task: a newer submission for the same
run replaces the older one (its execution was superseded).

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


@dataclass
class WorkerInfo:
    name: str
    capabilities: set[str]
    slots: int
    incarnation: int
    last_seen: float
    assigned: dict[str, float] = field(default_factory=dict)   # task id -> when offered
    tool_schemas: list = field(default_factory=list)

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
        self.lost: list[tuple[str, dict, bool]] = []   # (worker, task, it left): for the scheduler to report
        self.offered_total = 0

    # -- workers -----------------------------------------------------------------------------

    def hello(self, worker: str, capabilities: list[str], slots: int, running: list[str], incarnation: int,
              now: float, tool_schemas: list | None = None) -> list[Offer]:
        """A worker's periodic announcement: what it runs, its slots, and the tasks it is running."""
        info = self.workers.get(worker)
        if info is None or info.incarnation != incarnation:
            if info is not None:
                self._forget(info)
            info = self.workers[worker] = WorkerInfo(worker, set(capabilities), slots, incarnation, now)
            self._rotation.append(worker)
        info.capabilities = set(capabilities)
        info.slots = slots
        info.last_seen = now
        info.tool_schemas = tool_schemas or []
        still = set(running)
        for task_id, offered_at in list(info.assigned.items()):
            # Not running and offered a while ago: it finished (its done notice was lost) or
            # never arrived; either way its actor submits it again if it matters.
            if task_id not in still and now - offered_at > self.offer_grace:
                del info.assigned[task_id]
                self.tasks.pop(task_id, None)
        return self._match(now)

    def leave(self, worker: str, incarnation: int) -> bool:
        """A worker that says it stops: gone now (`lost` holds what it had been given). False if
        this incarnation of it is not known (it left already, or a new one said hello since)."""
        info = self.workers.get(worker)
        if info is None or info.incarnation != incarnation:
            return False
        self._forget(info, left=True)
        return True

    def stalled(self, now: float) -> None:
        """The scheduler did not run for a while: its workers' hellos meanwhile waited or bounced,
        and their silence says nothing (each would have been taken for dead, its tasks lost)."""
        for info in self.workers.values():
            info.last_seen = now

    def expire(self, now: float) -> list[str]:
        """Workers silent too long are gone; returns their names (`lost` then holds the tasks
        they had been given)."""
        gone = [w for w in self.workers.values() if now - w.last_seen > self.worker_timeout]
        for info in gone:
            self._forget(info)
        return [info.name for info in gone]

    def _forget(self, info: WorkerInfo, left: bool = False) -> None:
        del self.workers[info.name]
        if info.name in self._rotation:
            self._rotation.remove(info.name)
        for task_id in info.assigned:
            held = self.tasks.pop(task_id, None)
            if held is not None:
                self.lost.append((*held, left))

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
            return assigned[0]
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
