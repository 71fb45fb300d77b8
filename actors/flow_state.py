"""The state of a flow run, and how each journal record changes it.

A run's journal is a sequence of FLOW records in the write-ahead log. `apply()` is the only
function that turns a record into state: the owning actor calls it for each record it appends,
and a restarted actor calls it for each record it reads back, so live state and recovered state
cannot drift apart.

Operations of a flow are numbered (`seq`) in the order the flow's code asks for them: steps,
sleeps, channel waits, child flows and attribute writes. On replay the code must ask for the same
operations in the same order; the names recorded here are how a mismatch is detected.

Record types (body field `type`; every body has run, tenant, at, exec):
  run.started    flow, input, parent, parent_seq, parent_actor, start_at (a delayed start: not
                 dispatched before that time), schedule, scheduled_at (started by a schedule),
                 timeout_secs (cancelled if not ended this long after it began),
                 queue (waits for a place in that flow queue: actors/run_queues.py), priority and
                 queue_key (there)
                 (a fork's, actors/run_forks.py: forked_from, fork_seq, copied, attrs, messages)
  step.started   seq, name, attempt
  step.failed    seq, attempt, error            (an attempt failed; another may follow)
  step.interrupted seq, attempt                 (its worker stopped cleanly mid-attempt: not counted
                                                 against the step's retries)
  step.done      seq, name, ok, result | error  (the step's outcome, final)
  step.heartbeat seq, attempt, value
  sleep          seq, name, due
  wait           seq, name, channel, due        (due 0 = no timeout; channels: any of these, ctx.wait_any)
  op.done        seq, ok, result | error        (a sleep, wait, child, send or attribute write finished;
                                                 with op patch: a `ctx.patched` mark, taken at once)
  child.started  seq, name, child
  message        channel, msg_seq, message, key (published to the run; key: one message per key)
  message.taken  seq, channel, msg_seq          (consumed by the wait at seq)
  attr.set       key, value, seq                (seq -1: set by an update handler, not the flow)
  run.admitted   (a queued run got its place: from now on it is dispatched)
  run.ended      status (completed | failed | cancelled), result | error
"""
from __future__ import annotations

import collections
import time
from typing import Any

import msgpack

from actors.flow_op import Op

TERMINAL = frozenset({"completed", "failed", "cancelled"})

WAITABLE = ("suspended",)   # besides its end, what a caller of FLOW_GET may wait for (`until`)
EMITTED = "emitted"         # what a reader of its emitted values waits for (FLOW_STEPS `wait`): one more
MAX_WAIT_CHANNELS = 100     # that one wait listens to (`ctx.wait_any`)


class Run:
    __slots__ = ("run_id", "flow", "tenant", "input", "status", "result", "error", "exec", "last_alive", "ops",
                 "attrs", "channels", "waiting", "parent", "parent_seq", "parent_actor", "pending", "updates",
                 "updating", "created_at", "ended_at", "msg_counter", "waiters", "journal_bytes", "over_limit", "lost",
                 "left",
                 "stale", "link_checked", "forked_from", "fork_seq", "start_at", "schedule", "scheduled_at",
                 "timeout_secs", "timing_out", "queue", "admitted_at", "priority", "queue_key", "executing",
                 "first_open", "open_children", "message_keys")

    def __init__(self, run_id: str, flow: str, tenant: str) -> None:
        self.run_id = run_id
        self.flow = flow
        self.tenant = tenant
        self.input: Any = None
        self.status = "pending"
        self.result: Any = None
        self.error = ""
        self.exec = 0
        self.last_alive = time.monotonic()
        self.ops: dict[int, Op] = {}
        self.attrs: dict[str, Any] = {}
        self.channels: dict[str, collections.deque] = {}
        self.waiting: int | None = None       # seq of the wait op blocked on a channel
        self.executing = False                # an execution this actor sent runs on: it was not told to park since
        # where the first unfinished op may be (none before it is: only `reopen` moves it back), and
        # the children started and not ended: what the actor asks after every step and child's end,
        # found without reading every op again (a run of 10,000 children did 10,000² reads)
        self.first_open = 0
        self.open_children: set[int] = set()
        # the keys of the messages it took (actors/run_messages.py): True, or while its record is
        # being written, that record's future
        self.message_keys: dict[str, Any] = {}
        self.parent = ""
        self.parent_seq = -1
        self.parent_actor = ""
        self.pending: set = set()              # appends not yet acknowledged (or refused)
        self.updates: collections.deque = collections.deque()   # attribute updates waiting for the lock
        self.updating = False
        self.created_at = time.time()
        self.ended_at = 0.0
        self.msg_counter = 0
        self.waiters: list = []                # (status or None, future): callers waiting for the end or that status
        self.journal_bytes = 0                 # of the values its records hold (MAX_RUN_BYTES)
        self.over_limit = False
        self.lost = 0                          # executions in a row whose worker died with them
        self.left = 0                          # executions in a row whose worker stopped cleanly under them
        self.stale = False                     # left memory for its journal (actors/run_reloads.py)
        self.link_checked = self.last_alive    # when it last asked after its parent or child (actors/run_links.py)
        self.forked_from = ""                  # the run this one is a fork of (actors/run_forks.py), and where
        self.fork_seq = -1
        self.start_at = 0.0                    # a delayed start's time (0: at once)
        self.schedule = ""                     # the schedule that started it (actors/schedules.py), for when
        self.scheduled_at = 0.0
        self.timeout_secs = 0.0                # from when it began (its start_at, if delayed); 0: none
        self.timing_out = False                # its cancel for the timeout is under way
        self.queue = ""                        # the flow queue it runs under (actors/run_queues.py)
        self.admitted_at = 0.0                 # when it got its place there (0: it waits for one)
        self.priority = 0                      # in its queue: lower numbers are admitted first
        self.queue_key = ""                    # its key in a queue per key (actors/flow_queues.py)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    def first_unfinished(self) -> Op | None:
        """Its first op not over (None: none is, the run executes on past the last)."""
        seq = self.first_open
        while True:
            op = self.ops.get(seq)
            if op is None or not op.done:
                self.first_open = seq
                return op
            seq += 1

    def waiting_on(self) -> dict[str, Any] | None:
        """What a parked run waits for, as a client is told (GET /v1/runs/{id}): the sleep, the
        wait (its channels and timeout) or the children; None if it waits for none of those."""
        op = self.first_unfinished()
        if op is None or op.op not in ("sleep", "wait", "child") or self.ended:
            return None
        out: dict[str, Any] = {"op": op.op, "seq": op.seq, "since": op.started_at}
        if op.op == "child":
            out["children"] = [self.ops[seq].child for seq in sorted(self.open_children)]
        elif op.op == "wait":
            out["channels"] = list(op.channels or (op.channel,))
        if op.due:
            out["due"] = op.due
        return out

    def reopen(self, op: Op) -> None:
        """Undo an outcome memory took before its record was durable (the record was refused)."""
        op.done, op.ok, op.result, op.error, op.ended_at = False, True, None, "", 0.0
        self.first_open = min(self.first_open, op.seq)
        if op.op == "child":
            self.open_children.add(op.seq)

    def journal(self) -> list[dict[str, Any]]:
        """Outcomes of the finished operations, in order, up to the first unfinished one: what a
        new execution replays without asking."""
        out = []
        seq = 0
        while True:
            op = self.ops.get(seq)
            if op is None or not op.done:
                return out
            out.append(op.outcome())
            seq += 1

    @property
    def timeout_at(self) -> float:
        """When it is cancelled if it has not ended (0: never, or not yet: a queued run's time
        counts from its admission, as DBOS's does from its dequeue)."""
        if not self.timeout_secs or (self.queue and not self.admitted_at):
            return 0.0
        return max(self.created_at, self.start_at, self.admitted_at) + self.timeout_secs

    def waits_in_queue(self) -> bool:
        return bool(self.queue) and not self.admitted_at and not self.ended

    def waits_to_start(self, now: float) -> bool:
        """Whether it is a delayed start whose time has not come: nothing of it has run yet."""
        return self.start_at > now and not self.ops and not self.ended

    def summary(self) -> dict[str, Any]:
        """What a client is told of the run (GET /v1/runs/{id}): times as its journal has them."""
        status = "scheduled" if self.waits_to_start(time.time()) else "enqueued" if self.waits_in_queue() \
            else self.status
        body: dict[str, Any] = {"run_id": self.run_id, "status": status, "flow": self.flow,
                                "started_at": self.created_at, "ended_at": self.ended_at if self.ended else None}
        if self.start_at:
            body["start_at"] = self.start_at
        if self.schedule:
            body["schedule"], body["scheduled_at"] = self.schedule, self.scheduled_at
        if self.timeout_at:
            body["timeout_at"] = self.timeout_at
        if self.queue:
            body["queue"] = self.queue
            if self.priority:
                body["priority"] = self.priority
            if self.queue_key:
                body["queue_key"] = self.queue_key
            if self.admitted_at:
                body["admitted_at"] = self.admitted_at
        if self.parent:
            body["parent"] = self.parent
        if self.forked_from:
            body["forked_from"], body["fork_seq"] = self.forked_from, self.fork_seq
        if self.status == "suspended" and (waiting := self.waiting_on()) is not None:
            body["waiting_on"] = waiting
        if self.status == "completed":
            body["result"] = self.result
        elif self.error:
            body["error"] = self.error
        return body


def _op(run: Run, record: dict[str, Any], kind: str) -> Op:
    seq = int(record["seq"])
    op = run.ops.get(seq)
    if op is None:
        op = run.ops[seq] = Op(seq, kind, record.get("name", ""))
        op.started_at = float(record.get("at", 0.0))
    return op


_VALUE_FIELDS = ("input", "result", "value", "message", "error")
_pack = msgpack.Packer(use_bin_type=True).pack


def value_bytes(record: dict[str, Any]) -> int:
    """About what the record's values take as msgpack (strings and bytes as their length)."""
    total = 0
    for key in _VALUE_FIELDS:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, (str, bytes)):
            total += len(value)
        elif isinstance(value, (bool, int, float)):
            total += 9
        else:
            total += len(_pack(value))
    return total


def apply(run: Run, record: dict[str, Any]) -> None:
    """Change the run's state as the record says (see the module docstring for the types)."""
    kind = record["type"]
    run.journal_bytes += value_bytes(record)
    if "exec" in record and record["exec"] > run.exec:
        run.exec = record["exec"]
    if kind == "run.started":
        run.flow = record.get("flow", run.flow)
        run.input = record.get("input")
        run.parent = record.get("parent") or ""
        run.parent_seq = int(record.get("parent_seq", -1))
        run.parent_actor = record.get("parent_actor") or ""
        run.created_at = float(record.get("at", run.created_at))
        run.start_at = float(record.get("start_at") or 0.0)
        run.schedule = record.get("schedule") or ""
        run.scheduled_at = float(record.get("scheduled_at") or 0.0)
        run.timeout_secs = float(record.get("timeout_secs") or 0.0)
        run.queue = record.get("queue") or ""
        run.priority = record["priority"] if type(record.get("priority")) is int else 0
        run.queue_key = record["queue_key"] if type(record.get("queue_key")) is str else ""
        if run.status == "pending":
            run.status = "running"
        if record.get("forked_from"):
            _begin_fork(run, record)
    elif kind == "step.started":
        op = _op(run, record, "step")
        op.attempts = max(op.attempts, int(record.get("attempt", 1)))
    elif kind == "step.interrupted":
        op = _op(run, record, "step")
        attempt = int(record.get("attempt", 1))
        op.attempts = max(op.attempts, attempt)
        if attempt > op.interrupted_last:
            op.interrupted += 1
            op.interrupted_last = attempt
    elif kind == "step.failed":
        op = _op(run, record, "step")
        op.attempts = max(op.attempts, int(record.get("attempt", 1)))
        op.error = record.get("error", "")
    elif kind in ("step.done", "op.done"):
        op = _op(run, record, "step" if kind == "step.done" else record.get("op", "step"))
        op.done = True
        run.open_children.discard(op.seq)
        op.ended_at = float(record.get("at", 0.0))
        op.ok = bool(record.get("ok", True))
        op.result = record.get("result")
        op.error = record.get("error", "")
        if kind == "step.done":
            op.attempts = max(op.attempts, int(record.get("attempt", op.attempts or 1)))
        if run.waiting == op.seq:
            run.waiting = None
    elif kind == "step.heartbeat":
        _op(run, record, "step").heartbeat = record.get("value")
    elif kind == "sleep":
        _op(run, record, "sleep").due = float(record["due"])
    elif kind == "wait":
        op = _op(run, record, "wait")
        op.channel = record["channel"]
        op.channels = tuple(record.get("channels") or ())
        op.due = float(record.get("due", 0.0))
        if not op.done:
            run.waiting = op.seq
    elif kind == "child.started":
        op = _op(run, record, "child")
        op.child = record["child"]
        if not op.done:
            run.open_children.add(op.seq)
    elif kind == "message":
        run.msg_counter = max(run.msg_counter, int(record["msg_seq"]))
        if record.get("key") is not None:
            run.message_keys[record["key"]] = True
        run.channels.setdefault(record["channel"], collections.deque()).append(
            (int(record["msg_seq"]), record.get("message")))
    elif kind == "message.taken":
        queue = run.channels.get(record["channel"])
        if queue:
            taken = int(record["msg_seq"])
            run.channels[record["channel"]] = collections.deque(m for m in queue if m[0] != taken)
    elif kind == "attr.set":
        run.attrs[record["key"]] = record.get("value")
    elif kind == "run.admitted":
        run.admitted_at = float(record.get("at") or time.time())
    elif kind == "run.ended":
        run.status = record["status"]
        run.result = record.get("result")
        run.error = record.get("error", "")
        run.ended_at = float(record.get("at", time.time()))
        run.waiting = None


def _begin_fork(run: Run, record: dict[str, Any]) -> None:
    """A fork begins with the original's first outcomes, attributes and untaken messages."""
    run.forked_from = record["forked_from"]
    run.fork_seq = int(record.get("fork_seq", 0))
    for copied in record.get("copied") or ():
        op = run.ops[int(copied["seq"])] = Op(int(copied["seq"]), copied["op"], copied.get("name", ""))
        op.done, op.ok = True, bool(copied.get("ok", True))
        op.result, op.error = copied.get("result"), copied.get("error", "")
        op.attempts = int(copied.get("attempts", 0))
        op.started_at, op.ended_at = float(copied.get("started_at", 0.0)), float(copied.get("ended_at", 0.0))
        op.child, op.channel, op.due = copied.get("child", ""), copied.get("channel", ""), float(copied.get("due", 0.0))
        op.channels = tuple(copied.get("channels") or ())
        run.journal_bytes += value_bytes(copied)
    for key, value in (record.get("attrs") or {}).items():
        run.attrs[key] = value
        run.journal_bytes += value_bytes({"value": value})
    for channel, msg_seq, message in record.get("messages") or ():
        run.channels.setdefault(channel, collections.deque()).append((int(msg_seq), message))
        run.msg_counter = max(run.msg_counter, int(msg_seq))
        run.journal_bytes += value_bytes({"message": message})


def replay(run_id: str, records: list[dict[str, Any]]) -> Run:
    """A run rebuilt from its journal (records in log order)."""
    first = records[0] if records else {}
    run = Run(run_id, first.get("flow", ""), first.get("tenant", ""))
    for record in records:
        apply(run, record)
    return run


def next_message(run: Run, op: Op) -> str | None:
    """The channel whose waiting message the wait takes: of those it listens to, the one whose
    first message was published first (None: no message waits for it)."""
    first: tuple[int, str] | None = None
    for channel in op.channels or (op.channel,):
        queue = run.channels.get(channel)
        if queue and (first is None or queue[0][0] < first[0]):
            first = (queue[0][0], channel)
    return first[1] if first is not None else None
