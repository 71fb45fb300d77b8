"""A run whose SYNC journal record a writer refused (a full disk) is loaded again from its journal.

The actor applies a record to the run in memory as it appends it, so a refusal leaves the memory
ahead of the journal: a step's result that a restart would not have, which later steps could be
computed from. The requests callers make undo their own records (actors/run_requests.py); for
what workers report there is no one to tell but the worker, and nothing simple to undo. So the
run leaves memory as if its actor had restarted — the worker hears at once that its execution is
superseded (it would otherwise wait out its request timeout) — and comes back from its journal
once what it had appended has settled and the store can be read, to execute again from there.
A turn's run is not reloaded: it ends with its turn (actors/agent_loop.py).

A read of a run on its way back is answered from its journal at once (`Flows.find`). A write
(publish, update, cancel, a repeated start) cuts the reload's backoff short, since its own record
will tell whether the disk has room, and waits for it a while: while the disk stays full, the
caller hears the refusal that sent the run back (507) rather than its own request's timeout.

A mixin of `actors.flow_runs.Flows`.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from actors.flow_state import Run
from broker.protocol import Kind, Message
from storage.log_client import LogWriteError

RELOAD_RETRY_SECS = (0.5, 10.0)   # the first wait before loading again, and the longest
WRITE_WAIT_SECS = 5.0   # how long a write waits for its run to come back before it is refused


class Stale(LogWriteError):
    """A record for a run object that has left memory: the run's current one is not affected."""

    def __init__(self) -> None:
        super().__init__("unavailable", "the run is being loaded again from its journal after a refused write; "
                                        "try again")


class Reload:
    """A run on its way back from its journal: `done` once it is, `cause` the refusal that sent it."""

    __slots__ = ("done", "cause", "hurry")

    def __init__(self, cause: LogWriteError) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.cause = cause
        self.hurry = asyncio.Event()   # a write came: load now rather than after the backoff


class RunReloads:
    def refusable(self, handler: Callable[[Message], Awaitable[None]], kind: Kind | None = None,
                  answer: dict | None = None) -> Callable[[Message], Awaitable[None]]:
        """A worker-facing handler that, on a refused record, reloads the run and answers `answer`."""
        async def handle(msg: Message) -> None:
            try:
                await handler(msg)
            except LogWriteError as exc:
                if not isinstance(exc, Stale):
                    self.reload(msg.body["run_id"], exc)
                if kind is not None:
                    self.bus.reply(msg, kind, answer)
        return handle

    async def or_reload(self, run: Run, work: Awaitable[None]) -> None:
        """`work` for the run (a timer's or a child's end), reloading the run if a record is refused."""
        try:
            await work
        except LogWriteError as exc:
            if not run.stale:
                self.reload(run.run_id, exc)

    def reload(self, run_id: str, cause: LogWriteError) -> None:
        run = self.runs.get(run_id)
        if run is None or run.flow == "turn":
            return   # reloading already (or ended and gone); a turn's run ends with its turn
        run.stale = True
        self._forget(run_id)
        self.reloading[run_id] = Reload(cause)
        if (more := self.reloads_said.due()) is not None:
            self.log.warning("run %s had a journal record refused; loading it again from its journal%s", run_id, more)
        self.bus.spawn(self._reload(run))

    async def back_from_journal(self, run_id: str, write: bool) -> Run | None:
        """The run once it is back from its journal. A write hurries the reload and waits for it
        at most WRITE_WAIT_SECS; past that it is refused as the record that sent the run back was."""
        reload = self.reloading[run_id]
        if not write:
            await asyncio.shield(reload.done)
            return self.runs.get(run_id)
        reload.hurry.set()
        try:
            await asyncio.wait_for(asyncio.shield(reload.done), WRITE_WAIT_SECS)
        except asyncio.TimeoutError:
            raise LogWriteError(reload.cause.code, "the run is being loaded again from its journal after a refused "
                                                   f"write ({reload.cause}); try again") from None
        return self.runs.get(run_id)

    def _backoff(self, run_id: str) -> float:
        """How long to wait before this reload: doubling while the run's reloads follow each other
        (each new execution's first record refused again), from scratch after a quiet minute."""
        now = time.monotonic()
        last, wait = self.reloaded.get(run_id, (0.0, 0.0))
        wait = min(wait * 2, RELOAD_RETRY_SECS[1]) if now - last < 60.0 else RELOAD_RETRY_SECS[0]
        if len(self.reloaded) > 1000:
            self.reloaded = {r: v for r, v in self.reloaded.items() if now - v[0] < 60.0}
        self.reloaded[run_id] = (now + wait, wait)
        return wait

    async def _reload(self, stale: Run) -> None:
        reload = self.reloading[stale.run_id]
        wait, longest = RELOAD_RETRY_SECS
        try:
            await asyncio.gather(*list(stale.pending), return_exceptions=True)   # all it appended lands first
            try:   # the disk is likely still full
                await asyncio.wait_for(reload.hurry.wait(), self._backoff(stale.run_id))
            except asyncio.TimeoutError:
                pass
            while True:
                try:
                    run = await self._load_journal(stale.run_id)
                    break
                except Exception as exc:  # the store may be behind or failing on the same full disk
                    self.log.debug("cannot load run %s again yet (%s)", stale.run_id, exc)
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, longest)
        finally:
            del self.reloading[stale.run_id]
            reload.done.set_result(None)
        if run is None:
            return
        run.waiters += stale.waiters   # callers waiting for its end or its suspension
        if not run.ended:
            self.resume(run)
            op = self.blocked_on(run)
            if op is None or op.op == "child":   # a child's end it may have missed: the execution asks it
                self.dispatch(run)
