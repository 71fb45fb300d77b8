"""The bus protocol: every message kind that crosses the bus, who may send it and what answers it.
Nothing else invents kinds. Each kind's body fields: broker/bodies.py. How a message is laid out
in a frame, and decoded with those checks: broker/codec.py.
"""
from __future__ import annotations

import enum
import re
from typing import Any

from broker.sharding import ACTOR_PREFIX, LOG_WRITER_PREFIX, SCHEDULER, STORE


# A peer's socket identity: NAME#INCARNATION (hex), which the broker and the log inboxes check.
IDENTITY = re.compile(rb"^[a-z][a-z0-9_.\-/]{0,62}#[0-9a-f]{1,16}$")

# A gateway gives up on a turn start not answered within this (503 to its client); the start names
# that deadline, and an actor starts no turn past it (past_deadline), for nobody would stream it.
TURN_START_TIMEOUT_SECS = 10.0

# A write to a run (its start, a publish or broadcast, an update, a cancel), a turn's start and a session's close
# name when their caller gives up
# (`deadline`, wall-clock seconds). One that reached the run's actor later (it waited in a stalled
# actor's queue, or was resent) is not acted on: its caller has answered 503, which must mean that
# nothing was done, for a client then sends it again. The margin leaves room for an answer sent
# just before the deadline to reach the caller.
DEADLINE_MARGIN_SECS = 1.0


def past_deadline(body: dict[str, Any], now: float) -> bool:
    deadline = body.get("deadline")
    return isinstance(deadline, (int, float)) and now > deadline - DEADLINE_MARGIN_SECS

# What a run is in the listing of runs (the store query `runs`, GET /v1/runs), as GET /v1/runs/{id}
# names it: scheduled (a delayed start whose time has not come), enqueued (waits for a place in its
# flow queue) or running until it ends. A filter may also ask for `open`: any of those three.
RUN_STATES_OPEN = ("scheduled", "enqueued", "running")
RUN_STATUSES = ("open", *RUN_STATES_OPEN, "completed", "failed", "cancelled")
# What else a listing of runs may be filtered by: the run's start named this queue, key or schedule.
RUN_MATCH = ("queue", "queue_key", "schedule")

# The largest value a run records (a step's, tool's, handler's or flow's result, a flow's input,
# an attribute, a channel message), as msgpack. Each travels the bus in one message and lands in
# the log in one record, which carry at most 64 MB (the broker's MAXMSGSIZE, the log's
# MAX_RECORD_BYTES: a bigger one would cut a worker off the bus, or read back as a torn record),
# and in a DuckDB row, which the store loads within a small memory limit. Temporal's limit for a
# payload is 2 MB; this leaves room for big tool outputs and model contexts.
MAX_VALUE_BYTES = 4 << 20
# The most a run's journal holds of such values, all told (Temporal's history limit is 50 MB): an
# execution's offer carries them all in one message, and an actor loads them in one answer. A
# run that passes it fails, rather than cut its actor off the bus at its next execution.
MAX_RUN_BYTES = 32 << 20
# The most attributes a broadcast (CHANNEL_BROADCAST, POST /v1/channels/{name}) matches runs by.
MAX_WHERE = 20
# The most of those values one page of a run's operations carries (FLOW_STEPS), past its first:
# a page of 100 steps of 4 MB results would be a message of 400 MB.
STEPS_PAGE_BYTES = 4 << 20

PROTO = b"AOS/1"          # protocol id and major version, the first frame of every message
PROTO_FAMILY = b"AOS/"
BROKER = "broker"          # destination name of the broker itself
SUPERVISOR = "supervisor"  # the supervisor's name on the bus
MAX_NAME_BYTES = 64        # peer names and kinds are short ASCII


class ProtocolError(ValueError):
    """A frame list or field that does not follow this protocol."""


class Kind(enum.StrEnum):
    # ctl.*: peers and the broker
    BATCH = "ctl.batch"      # several envelopes for one destination in one frame (see encode_batch)
    HELLO = "ctl.hello"
    HEARTBEAT = "ctl.heartbeat"
    UNDELIVERABLE = "ctl.undeliverable"
    PEERS = "ctl.peers"
    PEERS_REPLY = "ctl.peers.reply"
    PEER_RESTARTED = "ctl.peer_restarted"   # broker -> everyone: a name has a new incarnation
    DRAIN = "ctl.drain"
    DRAINED = "ctl.drained"
    STATS = "ctl.stats"
    STATS_REPLY = "ctl.stats.reply"
    ERROR = "ctl.error"
    LEASE = "ctl.lease"
    # turn.*: gateway <-> session actor
    TURN_START = "turn.start"
    TURN_STARTED = "turn.started"
    TURN_DELTA = "turn.delta"
    TURN_DONE = "turn.done"
    TURN_FAILED = "turn.failed"
    TURN_CANCELLED = "turn.cancelled"
    TURN_CANCEL = "turn.cancel"
    TURN_RESUME = "turn.resume"
    TURN_STATUS = "turn.status"
    TURN_TOOL = "turn.tool"
    SESSION_CLOSE = "turn.close_session"
    SESSION_CLOSED = "turn.session_closed"
    SESSION_FORK = "turn.fork_session"
    SESSION_STATUS = "turn.session_status"
    TURN_APPROVE = "turn.approve"
    SESSION_FORKED = "turn.session_forked"
    # permit.*: actors <-> scheduler
    PERMIT_REQUEST = "permit.request"
    PERMIT_GRANT = "permit.grant"
    PERMIT_RELEASE = "permit.release"
    PERMIT_SYNC = "permit.sync"
    # queue.*: flow runs admitted under a queue's concurrency limit (actors/run_queues.py <->
    # the scheduler's actors/flow_queues.py); the permit is the run's id
    QUEUE_REQUEST = "queue.request"
    QUEUE_GRANT = "queue.grant"
    QUEUE_RELEASE = "queue.release"
    QUEUE_SYNC = "queue.sync"
    # log.*: senders <-> writer/log; writer/log -> writer/store
    LOG_APPEND = "log.append"
    LOG_ACK = "log.ack"
    LOG_FLUSHED = "log.flushed"
    LOG_LOADED = "log.loaded"
    LOG_MEND = "log.mend"
    LOG_MENDED = "log.mended"
    # store.*: readers <-> writer/store
    STORE_QUERY = "store.query"
    STORE_ROWS = "store.rows"
    STORE_PURGE = "store.purge"
    STORE_SUPERSEDED = "store.superseded"
    STORE_FORGET = "store.forget"
    STORE_CLOSED = "store.closed"
    STORE_FORGET_CLOSED = "store.forget_closed"
    # flow.*: runs of durable flows (clients <-> owning actor; worker -> actor on completion)
    FLOW_START = "flow.start"
    FLOW_GET = "flow.get"
    FLOW_STEPS = "flow.steps"
    FLOW_OPS = "flow.ops"
    FLOW_CANCEL = "flow.cancel"
    FLOW_RUN = "flow.run"
    FLOW_COMPLETE = "flow.complete"
    FLOW_ACK = "flow.ack"
    FLOW_CHILD_DONE = "flow.child_done"
    # step.*: the durable operations of a running flow (worker <-> owning actor)
    STEP_START = "step.start"
    STEP_GO = "step.go"
    STEP_RESULT = "step.result"
    STEP_HEARTBEAT = "step.heartbeat"
    # task.*: work for workers, queued by the scheduler
    TASK_SUBMIT = "task.submit"
    TASK_OFFER = "task.offer"
    TASK_DECLINE = "task.decline"
    TASK_DONE = "task.done"
    TASK_RESULT = "task.result"
    TASK_CANCEL = "task.cancel"
    TASK_LOST = "task.lost"
    WORKER_HELLO = "worker.hello"
    WORKER_ALIVE = "worker.alive"
    WORKER_BYE = "worker.bye"
    TOOLS_LIST = "tools.list"
    TOOLS = "tools"
    # timer.*: durable timers held by the scheduler
    TIMER_SET = "timer.set"
    TIMER_FIRE = "timer.fire"
    # channel.*, attr.*: messages to a flow and its attributes
    CHANNEL_PUBLISH = "channel.publish"
    CHANNEL_BROADCAST = "channel.broadcast"   # to every actor: the tenant's runs waiting on a channel
    CHANNEL_DELIVERED = "channel.delivered"
    CHANNEL_WAITING = "channel.waiting"       # to every actor: those runs, counted and listed
    CHANNEL_WAITERS = "channel.waiters"
    ATTR_GET = "attr.get"
    ATTR_UPDATE = "attr.update"
    ATTR_VALUES = "attr.values"
    # schedule.*: flow runs started on a cron expression (actors/schedules.py; client <-> the
    # actor its name routes to; a list is asked of every actor)
    SCHEDULE_PUT = "schedule.put"
    SCHEDULE_GET = "schedule.get"
    SCHEDULE_DELETE = "schedule.delete"
    SCHEDULE_LIST = "schedule.list"
    SCHEDULE = "schedule"
    SCHEDULES = "schedules"


# Control messages only one role sends, by its name (a trailing "/": any name under it). From
# anyone else a receiver drops them as malformed: a peer's bug must not drain the gateway, fence a
# log writer, move writer/store's idea of where a log ends or pause the provider's permits (a
# fuzzer sending them did all four), nor have writer/store drop rows as a log's compaction does.
SENDERS: dict[Kind, str] = {
    Kind.LEASE: SUPERVISOR,
    Kind.DRAIN: SUPERVISOR,
    Kind.PEER_RESTARTED: BROKER,
    Kind.UNDELIVERABLE: BROKER,
    Kind.LOG_FLUSHED: LOG_WRITER_PREFIX,
    Kind.LOG_LOADED: STORE,
    Kind.LOG_MEND: STORE,      # bucket GETs and a write into a sealed segment: only its reader asks
    # a log's compaction asks writer/store to drop rows: only a log's owner does
    Kind.STORE_PURGE: LOG_WRITER_PREFIX,
    Kind.STORE_SUPERSEDED: LOG_WRITER_PREFIX,
    Kind.STORE_FORGET: LOG_WRITER_PREFIX,
    Kind.STORE_CLOSED: LOG_WRITER_PREFIX,
    Kind.STORE_FORGET_CLOSED: LOG_WRITER_PREFIX,
    Kind.PERMIT_REQUEST: ACTOR_PREFIX,
    Kind.PERMIT_RELEASE: ACTOR_PREFIX,
    Kind.PERMIT_SYNC: ACTOR_PREFIX,
    Kind.PERMIT_GRANT: SCHEDULER,
    Kind.QUEUE_REQUEST: ACTOR_PREFIX,
    Kind.QUEUE_RELEASE: ACTOR_PREFIX,
    Kind.QUEUE_SYNC: ACTOR_PREFIX,
    Kind.QUEUE_GRANT: SCHEDULER,
    Kind.TIMER_SET: ACTOR_PREFIX,
    Kind.TIMER_FIRE: SCHEDULER,
}


def sent_by_its_role(kind: Kind, src: str) -> bool:
    """False when `kind` comes from a peer other than the one role that sends it (SENDERS)."""
    sender = SENDERS.get(kind)
    return sender is None or src == sender or (sender[-1] == "/" and src.startswith(sender))


# Requests and the kind of their reply. Receivers de-duplicate these by (sender, id): a re-sent
# request whose reply was already sent gets that reply again instead of running twice.
REQUESTS: dict[Kind, Kind] = {
    Kind.PEERS: Kind.PEERS_REPLY,
    Kind.STATS: Kind.STATS_REPLY,
    Kind.DRAIN: Kind.DRAINED,
    Kind.TURN_START: Kind.TURN_STARTED,
    Kind.TURN_RESUME: Kind.TURN_STATUS,
    Kind.TURN_CANCEL: Kind.TURN_STATUS,
    Kind.SESSION_CLOSE: Kind.TURN_STATUS,
    Kind.SESSION_CLOSED: Kind.TURN_STATUS,
    Kind.SESSION_FORK: Kind.SESSION_FORKED,
    Kind.SESSION_STATUS: Kind.TURN_STATUS,
    Kind.TURN_APPROVE: Kind.TURN_STATUS,
    Kind.LOG_APPEND: Kind.LOG_ACK,
    Kind.LOG_MEND: Kind.LOG_MENDED,
    Kind.STORE_QUERY: Kind.STORE_ROWS,
    Kind.STORE_PURGE: Kind.STORE_ROWS,
    Kind.STORE_SUPERSEDED: Kind.STORE_ROWS,
    Kind.STORE_FORGET: Kind.STORE_ROWS,
    Kind.STORE_CLOSED: Kind.STORE_ROWS,
    Kind.STORE_FORGET_CLOSED: Kind.STORE_ROWS,
    Kind.TOOLS_LIST: Kind.TOOLS,
    Kind.FLOW_START: Kind.FLOW_RUN,
    Kind.FLOW_GET: Kind.FLOW_RUN,
    Kind.FLOW_STEPS: Kind.FLOW_OPS,
    Kind.FLOW_CANCEL: Kind.FLOW_RUN,
    Kind.FLOW_COMPLETE: Kind.FLOW_ACK,
    Kind.FLOW_CHILD_DONE: Kind.FLOW_ACK,
    Kind.STEP_START: Kind.STEP_GO,
    Kind.STEP_RESULT: Kind.FLOW_ACK,
    Kind.TASK_RESULT: Kind.FLOW_ACK,
    Kind.CHANNEL_PUBLISH: Kind.FLOW_ACK,
    Kind.CHANNEL_BROADCAST: Kind.CHANNEL_DELIVERED,
    Kind.CHANNEL_WAITING: Kind.CHANNEL_WAITERS,
    Kind.ATTR_GET: Kind.ATTR_VALUES,
    Kind.ATTR_UPDATE: Kind.ATTR_VALUES,
    Kind.SCHEDULE_PUT: Kind.SCHEDULE,
    Kind.SCHEDULE_GET: Kind.SCHEDULE,
    Kind.SCHEDULE_DELETE: Kind.SCHEDULE,
    Kind.SCHEDULE_LIST: Kind.SCHEDULES,
}
# Requests that change nothing: a re-sent one is simply run again, so its reply is not kept for it
# (writer/store asks every log writer's end for each `sync` read: a new session's first load).
READS = frozenset({Kind.PEERS, Kind.STATS, Kind.STORE_QUERY, Kind.TOOLS_LIST, Kind.FLOW_GET, Kind.FLOW_STEPS,
                   Kind.ATTR_GET, Kind.CHANNEL_WAITING})

KIND_BYTES: dict[Kind, bytes] = {k: k.value.encode() for k in Kind}
TURN_EVENTS = frozenset({Kind.TURN_STARTED, Kind.TURN_DELTA, Kind.TURN_TOOL, Kind.TURN_DONE, Kind.TURN_FAILED,
                         Kind.TURN_CANCELLED})
TURN_TERMINAL = frozenset({Kind.TURN_DONE, Kind.TURN_FAILED, Kind.TURN_CANCELLED})


class Message:
    """One delivered message. Actors see these, never raw frames."""

    __slots__ = ("src", "kind", "id", "sent_at", "reply_to", "session", "turn", "body")

    def __init__(self, src: str, kind: Kind, id: int, sent_at: float, reply_to: int,
                 session: str, turn: str, body: dict[str, Any]) -> None:
        self.src = src
        self.kind = kind
        self.id = id
        self.sent_at = sent_at
        self.reply_to = reply_to
        self.session = session
        self.turn = turn
        self.body = body

    def __repr__(self) -> str:
        return f"<Message {self.kind} {self.src} id={self.id} session={self.session!r}>"
