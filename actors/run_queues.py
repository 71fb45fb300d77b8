"""A run started with `queue` runs only when that flow queue has a place for it (its limit is
`kernel.flow_queues`; the places are the scheduler's, actors/flow_queues.py). Until then it is
`enqueued`: journaled, cancellable, holding no worker. Its actor asks the scheduler for a place
(the run id is the permit), journals `run.admitted` when it gets one (SYNC, before the first
dispatch) and gives the place back when the run's end is in the log.

Every SYNC_SECS it tells the scheduler what it holds (admitted runs) and waits for, which is how
a lost request, grant or release, or a restart of either side, comes right: a place nobody
lists goes back to the queue. For a queue with a rate it also lists the runs it admitted within
the rate's window (which the grant tells), with their ages: what a new scheduler counts. A run's
admission is in its journal, so a restarted actor lists the admitted runs it recovered as held,
not as new requests, and a queue is not run over its limit by a crash; and it reads the
admissions within each rate's window back from the journal, ended runs' too, so the rate holds
when the scheduler restarted with it.
"""
from __future__ import annotations

import asyncio
import time

from actors.flow_queues import place_of
from actors.flow_state import Run
from broker.protocol import Kind, Message
from broker.sharding import SCHEDULER, shard_of


class RunQueues:
    """A mixin of `actors.flow_runs.Flows`."""

    def place(self, run: Run) -> str:
        """Where the run waits: its queue, or its key's place in a queue per key."""
        return place_of(self.queue_specs, run.queue, run.queue_key, run.tenant)

    def enqueue(self, run: Run) -> None:
        body = {"queue": self.place(run), "run_id": run.run_id, "tenant": run.tenant}
        if run.priority:
            body["priority"] = run.priority
        self.bus.send(SCHEDULER, Kind.QUEUE_REQUEST, body, session=run.run_id)

    def release_place(self, run: Run) -> None:
        self.bus.send(SCHEDULER, Kind.QUEUE_RELEASE, {"queue": self.place(run), "run_id": run.run_id},
                      session=run.run_id)

    def on_queue_grant(self, msg: Message) -> None:
        run_id = msg.body["run_id"]
        run = self.runs.get(run_id)
        if run is None or run.ended:   # (not for a run on its way back from its journal: it asks again)
            if run_id not in self.reloading:
                self.bus.send(SCHEDULER, Kind.QUEUE_RELEASE, dict(msg.body), session=run_id)
            return
        if self.place(run) != msg.body["queue"] or run.admitted_at or run_id in self.admitting or run.stale:
            return   # a grant sent again, or not this run's queue
        self.admitting.add(run.run_id)
        self.bus.spawn(self.or_reload(run, self._admit(run, float(msg.body.get("window_secs") or 0.0))))

    async def _admit(self, run: Run, window_secs: float) -> None:
        try:
            await self.record(run, "run.admitted")
        finally:
            self.admitting.discard(run.run_id)
        if window_secs > 0 and run.admitted_at:
            self.queue_starts[run.run_id] = (self.place(run), run.admitted_at, window_secs)
        if not run.ended and self.blocked_on(run) is None:
            self.dispatch(run)

    async def recover_queue_starts(self) -> None:
        """After a start: this shard's admissions within their queues' rate windows, ended runs'
        too, from the journal, to list in its syncs as before the restart. A scheduler that
        restarted with this actor has only these to count what those windows hold."""
        windows = {name: spec.per_secs for name, spec in self.queue_specs.items() if spec.starts}
        if not windows:
            return
        now = time.time()
        rows = (await self.query("recent_admissions", "", after=int(now - max(windows.values())) - 1,
                                 sync=True))["rows"]
        for row in rows:
            run_id, queue, at = row["run_id"], row["queue"], row["at"]
            window = windows.get(queue)
            if window is None or now - at >= window or run_id in self.queue_starts \
                    or shard_of(run_id.split("/", 1)[0], self.shards) != self.index:
                continue
            self.queue_starts[run_id] = (place_of(self.queue_specs, queue, row["queue_key"], row["tenant"]), at,
                                         window)

    def queue_ended(self, run: Run, appended: asyncio.Future) -> None:
        """The run's end is being appended: its place goes back once that is in the log."""
        appended.add_done_callback(lambda fut: fut.cancelled() or fut.exception() or self.release_place(run))

    def sync_queues(self) -> None:
        queues: dict[str, dict[str, list]] = {}
        now = time.time()
        for run in self.runs.values():
            if not run.queue or run.ended or run.stale:
                continue
            mine = queues.setdefault(self.place(run), {"held": [], "waiting": []})
            if run.admitted_at or run.run_id in self.admitting:
                mine["held"].append([run.run_id, run.tenant])
            elif not run.waits_to_start(now):
                mine["waiting"].append([run.run_id, run.tenant, run.priority] if run.priority
                                       else [run.run_id, run.tenant])
        for run_id, (queue, admitted_at, window_secs) in list(self.queue_starts.items()):
            if now - admitted_at >= window_secs:
                del self.queue_starts[run_id]
            else:
                queues.setdefault(queue, {"held": [], "waiting": []}).setdefault("started", []).append(
                    [run_id, round(max(0.0, now - admitted_at), 3)])
        if queues or self.queues_synced:   # (an actor that never had a queued run stays quiet)
            self.queues_synced = True
            self.bus.send(SCHEDULER, Kind.QUEUE_SYNC, {"queues": queues, "incarnation": self.bus.incarnation})
