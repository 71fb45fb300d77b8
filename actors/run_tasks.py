"""Tasks an actor has workers run for its runs: attribute update handlers and an agent's tools.
Each is offered through the scheduler to a worker that has it, and sent again by the watchdog
(actors/flow_runs.py) while no worker reports it; its result completes the future its caller
awaits."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.run_requests import TaskFailed
from broker.protocol import Kind, Message
from broker.sharding import SCHEDULER


class RunTasks:
    """A mixin of `actors.flow_runs.Flows`."""

    def task_id_of(self, future: asyncio.Future) -> str:
        """The id `submit_task` gave the task of this future ("" once it is done)."""
        return next((task_id for task_id, entry in self.tasks.items() if entry[0] is future), "")

    def cancel_task(self, task_id: str) -> None:
        """Stop a task wherever it is: on its worker, or still in the scheduler's queue."""
        entry = self.tasks.pop(task_id, None)
        if entry is None:
            return
        if entry[3]:
            self.bus.send(entry[3], Kind.TASK_CANCEL, {"task_id": task_id})
        self.bus.send(SCHEDULER, Kind.TASK_CANCEL, {"task_id": task_id})
        if not entry[0].done():
            entry[0].cancel()

    def submit_task(self, kind: str, name: str, tenant: str, payload: Any, run_id: str = "") -> asyncio.Future:
        self.task_counter += 1
        task_id = f"{self.bus.name}.{self.bus.incarnation:x}.{self.task_counter}"
        body = {"task_id": task_id, "kind": kind, "name": name, "tenant": tenant, "payload": payload}
        if run_id:
            body["run_id"] = run_id
        fut = asyncio.get_running_loop().create_future()
        self.tasks[task_id] = [fut, body, time.monotonic(), ""]
        fut.add_done_callback(lambda _: self.tasks.pop(task_id, None))
        self.bus.send(SCHEDULER, Kind.TASK_SUBMIT, body, session=run_id)
        return fut

    def on_task_result(self, msg: Message) -> None:
        entry = self.tasks.get(msg.body["task_id"])
        if entry is not None and not entry[0].done():
            if msg.body["ok"]:
                entry[0].set_result(msg.body.get("result"))
            else:
                entry[0].set_exception(TaskFailed(msg.body.get("error") or "the task failed"))
        self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})
