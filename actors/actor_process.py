"""The session actor role: the sessions hashed to this shard, and their one active turn each.

A new turn on a session cancels the running one (last-wins). Finished turns stay replayable for
`kernel.turn_retention_secs`; idle sessions leave memory after `kernel.session_ttl_secs`.
It never fsyncs and never talks to DuckDB: durable work goes through the log writer.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time

from agentos import metrics, service
from agentos.config import Config
from agentos.rundir import RunDir
from agentos.running_time import wait_running
from actors.agent_loop import AgentLoop, turn_run_id
from actors.closing import ClosingSessions
from actors.flow_queues import parse_queues
from actors.flow_runs import Flows
from actors.permit_client import PermitClient
from actors.persistence import Persistence, StorageUnavailable
from actors.provider import Provider, ProviderError
from actors.session import Session, SessionTable
from actors.session_forks import SessionForks
from actors.tool_approvals import ToolApprovals
from actors.turn import Turn, ended_first
from broker.client import Bus
from broker.protocol import TURN_START_TIMEOUT_SECS, Kind, Message, past_deadline
from storage.log_client import LogWriteError
from broker.address import bus_address

CLOSE_WAIT_SECS = 5.0   # for a closing session's turn to end, and for the log to take its records
UNWIND_SECS = 10.0      # for a superseded turn to end before the turn that superseded it begins


class Actor:
    def __init__(self, config: Config, index: int, bus_endpoint: str, log: logging.Logger) -> None:
        self.config = config
        self.name = f"actor/{index}"
        self.log = log
        self.sessions = SessionTable(config.kernel.session_ttl_secs)
        self.turns: dict[str, Turn] = {}
        self.finished: collections.deque[Turn] = collections.deque()
        self.closing = ClosingSessions()
        self.dropped_streams: dict[str, float] = {}   # stream -> when forgotten: its gateway cancelled it
        self.bus = Bus(self.name, bus_endpoint, {}, heartbeat_secs=config.broker.heartbeat_secs, log=log,
                       spill_bytes=config.broker.spill_ring_bytes)
        self.provider = Provider(config.provider)
        self.permits = PermitClient(self.bus)
        self.persistence = Persistence(self.bus, config)
        self.flows = Flows(self.bus, self.persistence.log, self.persistence.query, index, config.actor_count, log,
                           config.storage.retention_secs)
        self.flows.on_open_turn = self.resume_turn
        self.flows.queue_specs = parse_queues(config.kernel.flow_queues)
        self.approvals = ToolApprovals(self.flows, config.kernel.approve_tools, config.kernel.approval_timeout_secs,
                                       self.persistence)
        self.loop = AgentLoop(self.provider, self.permits, self.persistence, self.flows, self.bus,
                              config.provider.max_retries, config.kernel.max_steps_per_turn, self.approvals,
                              config.kernel.tool_calls_at_once)
        for kind, handler in self.flows.handlers().items():
            self.bus.on(kind, handler)
        for kind, handler in {Kind.TURN_START: self.on_turn_start, Kind.TURN_CANCEL: self.on_turn_cancel,
                              Kind.TURN_RESUME: self.on_turn_resume, Kind.SESSION_CLOSE: self.on_session_close,
                              Kind.SESSION_CLOSED: self.on_session_closed,
                              Kind.SESSION_FORK: SessionForks(self).on_fork,
                              Kind.SESSION_STATUS: self.on_session_status, Kind.TURN_APPROVE: self.on_turn_approve,
                              Kind.PERMIT_GRANT: self.permits.on_grant,
                              Kind.STATS: self.on_stats}.items():
            self.bus.on(kind, handler)

    # -- bus handlers ---------------------------------------------------------------------

    def on_session_closed(self, msg: Message) -> None:
        """The gateway is done with a close (actors/closing.py). A resent notice the bus client
        has seen is answered from its cache and ends no second close."""
        self.closing.end(msg.body["session"])
        self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": "", "state": "closed"})

    async def on_session_status(self, msg: Message) -> None:
        """The session's running turn, if any (GET /v1/sessions/{sid}): a client that lost its
        stream finds the turn to follow again."""
        await self.flows.ready.wait()   # a turn our predecessor was running is known by then
        sid = msg.body["session"]
        session = self.sessions.get(sid)
        turn = session.active if session is not None and sid not in self.closing else None
        if turn is None or turn.ended:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": "", "state": "idle"})
        else:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id,
                                                   "state": "resumed" if turn.resumed else "running",
                                                   "approvals": [p.view for p in turn.approvals.values()]})

    async def on_turn_approve(self, msg: Message) -> None:
        """A person's answer for a tool call waiting in a turn (actors/tool_approvals.py)."""
        await self.flows.ready.wait()   # a turn our predecessor was running is known by then
        b = msg.body
        turn = self.turns.get(b["turn_id"])
        run = self.flows.runs.get(turn_run_id(b["session"], b["turn_id"])) if turn is not None else None
        if turn is None or turn.session_id != b["session"] or turn.ended or run is None:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": b["turn_id"], "state": "unknown", "code": "not_found",
                                                   "error": "no such turn is running in this session"})
            return
        code = await self.approvals.answer(turn, run, b["call_id"], b["approve"], b.get("reason") or "")
        self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id, "state": "running", "code": code,
                                               "error": "no call of this turn waits for approval under that id"
                                               if code == "not_waiting" else f"not recorded: {code}"} if code else
                       {"turn_id": turn.turn_id, "state": "approved" if b["approve"] else "denied"})

    def on_turn_start(self, msg: Message, journal_checked: bool = False) -> None:
        b = msg.body
        turn_id, session_id = b["turn_id"], b["session"]
        if b.get("stream") in self.dropped_streams:
            return   # its client left, or its gateway answered 503, before this came: nobody reads it
        known = self.turns.get(turn_id)
        if known is not None and b.get("keyed"):   # its Idempotency-Key again: that turn, from its start
            self._stream_again(msg, known)
            return
        if known is not None:  # a re-sent start: answer as the first time
            self.bus.reply(msg, Kind.TURN_STARTED, known.events[0][1])
            return
        if b.get("keyed") and not journal_checked:
            self.bus.spawn(self._keyed_start(msg))
            return
        if past_deadline(b, time.time()):
            return   # its gateway answered 503 (this actor was stalled): nobody streams it
        if session_id in self.closing:   # it starts once the close is done, on an empty session
            self.bus.spawn(self._start_after_close(msg))
            return
        session = self.sessions.open(session_id, b["tenant"])
        before = session.active
        if before is not None:
            before.cancel("superseded")
        turn = Turn(self.bus, turn_id, session_id, b["tenant"], b["input"], msg.src,
                    self.config.kernel.delta_window_ms / 1000.0)
        turn.system = b.get("system")
        turn.stream = b.get("stream") or ""
        started = turn.record(Kind.TURN_STARTED, {"data": {"turn_id": turn_id, "session_id": session_id}})
        self.bus.reply(msg, Kind.TURN_STARTED, started)
        session.active = turn
        self.turns[turn_id] = turn
        turn.task = asyncio.get_running_loop().create_task(
            self.run_turn(turn, session, after=before.task if before is not None else None))

    def _stream_again(self, msg: Message, turn: Turn) -> None:
        """A keyed start of a turn this actor has: its events again from the first, to the
        gateway that asks (the client's first stream broke), and live ones after."""
        b = msg.body
        if turn.session_id != b["session"] or turn.input != b["input"]:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id, "state": "unknown", "code": "conflict",
                                                   "error": "this Idempotency-Key began a turn with another input"})
            return
        self._held_by(turn, b.get("stream"))
        self.bus.reply(msg, Kind.TURN_STARTED, turn.events[0][1])
        turn.replay(1, msg.src)

    async def _keyed_start(self, msg: Message) -> None:
        """A keyed start of a turn this actor does not have: refused if its journal says it ran
        (past the turns' retention, or before a restart), else begun like any."""
        b = msg.body
        await self.flows.ready.wait()
        try:
            rows = (await self.persistence.query("flow_records", turn_run_id(b["session"], b["turn_id"]),
                                                 sync=True))["rows"]
        except StorageUnavailable as exc:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": b["turn_id"], "state": "unknown", "code": "unavailable",
                                                   "error": f"whether this key's turn ran could not be read: {exc}"})
            return
        if rows and self.turns.get(b["turn_id"]) is None:
            # (a turn's records are appended ASYNC: its run.started need not come first in the log)
            began = next((r for r in rows if r.get("type") == "run.started"), {})
            same = (began.get("input") or {}).get("input", b["input"]) == b["input"]
            self.bus.reply(msg, Kind.TURN_STATUS, {
                "turn_id": b["turn_id"], "state": "ended", "code": "turn_exists" if same else "conflict",
                "error": "this Idempotency-Key's turn ran already: its answer is in the transcript" if same else
                         "this Idempotency-Key began a turn with another input"})
            return
        self.on_turn_start(msg, journal_checked=True)

    async def _start_after_close(self, msg: Message) -> None:
        await self.closing.wait(msg.body["session"])
        if past_deadline(msg.body, time.time()):
            return    # a slow close: the gateway has answered 503, and the client may try again
        self.on_turn_start(msg)

    @staticmethod
    def _held_by(turn: Turn, stream: str | None) -> None:
        """A client's stream (its start again, or a resume) now reads the turn: a disconnect's
        cancel in its grace is off, and one from an older stream, arriving later, is stale."""
        if turn.pending_cancel is not None:
            turn.pending_cancel.cancel()
            turn.pending_cancel = None
        turn.stream = stream or ""

    def on_turn_cancel(self, msg: Message) -> None:
        """Cancel the session's turn (the one named, if named). A gateway's cancel names the
        stream it gave up: a start or resume of that stream that comes after it is not run,
        and the turn is left to a later stream of the same client (a keyed start sent again)."""
        session = self.sessions.get(msg.body["session"])
        turn = session.active if session is not None else None
        wanted = msg.body.get("turn_id") or ""
        stream = msg.body.get("stream") or ""
        cancelled = False
        if stream:   # (kept in the order they expire: the oldest first)
            now = time.monotonic()
            dropped = self.dropped_streams
            while dropped and dropped[oldest := next(iter(dropped))] <= now:
                del dropped[oldest]
            dropped.pop(stream, None)
            dropped[stream] = now + TURN_START_TIMEOUT_SECS
            if turn is not None and turn.stream and turn.stream != stream:
                turn = None   # another stream reads it now
        if turn is not None and (not wanted or wanted == turn.turn_id):
            reason = msg.body.get("reason") or "cancelled"
            grace = float(msg.body.get("after_secs") or 0.0)
            if grace > 0:  # a disconnect: the client may come back for the stream
                turn.pending_cancel = asyncio.get_running_loop().call_later(grace, turn.cancel, reason)
            else:
                cancelled = turn.cancel(reason)
        self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id if turn else wanted,
                                               "state": "cancelled" if cancelled else "idle"})

    async def on_turn_resume(self, msg: Message) -> None:
        await self.flows.ready.wait()  # interrupted turns are known once the open runs are loaded
        turn = self.turns.get(msg.body["turn_id"])
        if turn is None or turn.session_id != msg.body["session"]:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": msg.body["turn_id"], "state": "unknown"})
            return
        if turn.resumed:  # finishing after our restart: its old stream cannot continue
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id, "state": "resumed"})
            return
        if msg.body.get("stream") in self.dropped_streams:
            self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": turn.turn_id, "state": "unknown"})
            return   # a probe of a stream its gateway has since cancelled: nobody reads it
        self._held_by(turn, msg.body.get("stream"))
        turn.replay(msg.body["after"], msg.src)
        status = {"turn_id": turn.turn_id, "state": "ended" if turn.ended else "running"}
        if turn.ended and turn.events:
            status["last"] = turn.events[-1][1]["seq"]   # its terminal event's id
        self.bus.reply(msg, Kind.TURN_STATUS, status)

    async def on_session_close(self, msg: Message) -> None:
        """Before the gateway closes a session (storage/session_closing.py): its turn ends, it
        leaves memory (its next use starts from what the store then has: nothing), and whatever
        this actor appended for it is acknowledged, so the log's ends cover it."""
        sid = msg.body["session"]
        if past_deadline(msg.body, time.time()):
            return   # its gateway answered 503 (this actor was stalled): a hold now would only delay turns
        self.closing.begin(sid)         # before any await: a turn start after this one waits
        await self.flows.ready.wait()   # a turn our predecessor was running is known by then
        running = [t for t in self.turns.values() if t.session_id == sid and not t.ended]
        for turn in running:
            turn.cancel_reason = "session_closed"   # one still loading to resume sees it and stops
            turn.cancel("session_closed")
        tasks = [t.task for t in running if t.task is not None]
        await wait_running(lambda: all(t.done() for t in tasks), CLOSE_WAIT_SECS)   # (a stall not counted)
        self.sessions.drop(sid)
        drained = await self.persistence.log.drain(CLOSE_WAIT_SECS)
        self.bus.reply(msg, Kind.TURN_STATUS, {"turn_id": running[0].turn_id if running else "",
                                               "state": "closed" if drained else "busy"})

    def on_stats(self, msg: Message) -> None:
        running = sum(1 for t in self.turns.values() if not t.ended)
        self.bus.reply(msg, Kind.STATS_REPLY, {"role": "actor", "stats": {
            "sessions": len(self.sessions), "turns_running": running, "turns_retained": len(self.turns),
            "permits_held": len(self.permits.held), "permits_waiting": len(self.permits.waiting),
            "flows": self.flows.stats(), "bus": self.bus.stats()}})

    # -- turns ----------------------------------------------------------------------------

    def resume_turn(self, run) -> None:
        """Finish a turn our predecessor was running when it died. It is known at once (a probe
        of its old stream learns it is `resumed`); its session loads in the background."""
        info = run.input or {}
        turn = Turn(self.bus, info["turn"], info["session"], run.tenant, info.get("input", ""), "", 0.0)
        turn.resumed, turn.system = True, info.get("system")
        self.turns[turn.turn_id] = turn
        self.bus.spawn(self._finish_resumed(run, turn, int(info.get("user_index", 0))))

    async def _finish_resumed(self, run, turn: Turn, user_index: int) -> None:
        session = self.sessions.open(turn.session_id, run.tenant)
        try:
            await self.persistence.ensure_loaded(session)
        except StorageUnavailable as exc:
            self.log.error("cannot resume turn %s: %s", turn.turn_id, exc)
            self._abandon(turn)
            return
        if session.active is not None or turn.cancel_reason:   # a newer turn, or the session was closed
            self.flows.record(run, "run.ended", sync=False, status="cancelled",
                              error=turn.cancel_reason or "superseded by a newer turn")
            self._abandon(turn)
            return
        if len(session.messages) <= user_index:
            del session.messages[user_index:]
            session.messages.append({"role": "user", "content": turn.input})
        turn.replay_pos = user_index + 1
        self.log.info("resuming turn %s of session %s from step %d", turn.turn_id, session.id, len(run.journal()))
        session.active = turn
        turn.record(Kind.TURN_STARTED, {"data": {"turn_id": turn.turn_id, "session_id": session.id, "resumed": True}})
        turn.task = asyncio.get_running_loop().create_task(self.run_turn(turn, session, run))

    def _abandon(self, turn: Turn) -> None:
        turn.ended_at = time.monotonic()
        self.finished.append(turn)

    async def run_turn(self, turn: Turn, session: Session, journal=None, after: asyncio.Task | None = None) -> None:
        try:
            turn.running = True
            if after is not None and not await ended_first(after, UNWIND_SECS):
                self.log.warning("turn %s starts before the turn it superseded on session %s has ended",
                                 turn.turn_id, turn.session_id)
            if turn.cancel_reason:    # cancelled before this first step (Turn.cancel)
                raise asyncio.CancelledError
            if journal is None:
                self.persistence.event_nowait(turn, "turn.started", {"input_chars": len(turn.input)})
            data = await self.loop.run(turn, session, journal)
            turn.emit(Kind.TURN_DONE, {"data": data})
        except asyncio.CancelledError:
            turn.emit(Kind.TURN_CANCELLED, {"reason": turn.cancel_reason or "cancelled"})
        except ProviderError as exc:
            turn.emit(Kind.TURN_FAILED, {"code": exc.kind, "message": exc.message})
        except StorageUnavailable as exc:
            turn.emit(Kind.TURN_FAILED, {"code": "storage_unavailable", "message": str(exc)})
        except LogWriteError as exc:
            turn.emit(Kind.TURN_FAILED, {"code": exc.code, "message": f"the turn could not be made durable: {exc}"})
        except Exception as exc:  # a bug must end the stream clearly, not hang it
            self.log.exception("turn %s failed", turn.turn_id)
            turn.emit(Kind.TURN_FAILED, {"code": "internal", "message": f"internal error: {exc!r}"})
        finally:
            self._record_end(turn)
            run = self.flows.runs.get(f"{session.id}/{turn.turn_id}")
            if run is not None and not run.ended and turn.outcome in ("failed", "cancelled"):
                self.flows.record(run, "run.ended", sync=False, status=turn.outcome, error=turn.cancel_reason)
            self.flows.runs.pop(f"{session.id}/{turn.turn_id}", None)
            metrics.inc(metrics.turns.labels(turn.outcome or "unknown"))
            metrics.observe(metrics.turn_duration, (time.monotonic() - turn.started_at) * 1000.0)
            if session.active is turn:
                session.active = None
            session.last_used = time.monotonic()
            self.finished.append(turn)

    def _record_end(self, turn: Turn) -> None:
        """The event of a turn that did not complete (a completed one is recorded with its checkpoint)."""
        kind, body = turn.events[-1] if turn.events else (None, {})
        if kind is Kind.TURN_FAILED:
            data = {"outcome": "failed", "error": {"code": body["code"], "message": body["message"]}}
        elif kind is Kind.TURN_CANCELLED:
            data = {"outcome": "cancelled", "reason": body["reason"]}
        else:
            return
        self.persistence.event_nowait(turn, f"turn.{data['outcome']}", data)

    async def housekeeping(self) -> None:
        period = min(1.0, self.config.kernel.session_ttl_secs / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            while self.finished and now - self.finished[0].ended_at > self.config.kernel.turn_retention_secs:
                self.turns.pop(self.finished.popleft().turn_id, None)
            evicted = self.sessions.evict_idle(now)
            if evicted:
                metrics.evicted_sessions.inc(evicted)
            metrics.active_sessions.set(len(self.sessions))
            metrics.active_processes.set(sum(1 for t in self.turns.values() if not t.ended))

    async def shutdown(self) -> None:
        running = [t for t in self.turns.values() if not t.ended and t.task is not None]
        for turn in running:
            turn.cancel("shutdown")
        if running:
            await asyncio.wait([t.task for t in running], timeout=2.0)
        await self.persistence.log.drain(5.0)
        await self.persistence.log.close()


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    async def run(stop: asyncio.Event) -> int:
        actor = Actor(config, index, bus_address(config, run_dir), log)
        await actor.provider.start()
        await actor.bus.start()
        tasks = [service.lifelong(actor.housekeeping()), service.lifelong(actor.permits.sync_loop()),
                 service.lifelong(actor.flows.load()), service.lifelong(actor.flows.watchdog())]
        log.info("serving shard %d of %d, provider %s", index, config.actor_count, config.provider.base_url)
        await stop.wait()
        await actor.shutdown()
        for task in tasks:
            task.cancel()
        await actor.bus.close()
        await actor.provider.close()
        return service.EXIT_OK

    return service.run(run)
