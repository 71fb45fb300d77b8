"""The body of each message kind (broker/protocol.py `Kind`): its required and optional fields
and the types each may have. broker/codec.py checks every decoded message against these, so a
handler reads its fields without checking them again.
"""
from __future__ import annotations

from dataclasses import dataclass

from broker.protocol import Kind

# Required and optional body fields per kind: name -> accepted type(s).
_NUM = (int, float)
_Fields = dict[str, type | tuple[type, ...]]


@dataclass(frozen=True, slots=True)
class Spec:
    required: _Fields
    optional: _Fields


def _spec(required: _Fields | None = None, **optional: type | tuple[type, ...]) -> Spec:
    return Spec(required or {}, optional)


SPECS: dict[Kind, Spec] = {
    Kind.BATCH: _spec(),  # its body is not msgpack: u32-length-prefixed envelopes
    Kind.HELLO: _spec({"role": str, "pid": int}),
    Kind.HEARTBEAT: _spec({"role": str, "pid": int}),
    # Sent by the broker back to a sender; its header is the undelivered message's header.
    Kind.UNDELIVERABLE: _spec({"dest": str, "kind": str, "reason": str}),
    Kind.PEERS: _spec(),
    Kind.PEERS_REPLY: _spec({"peers": dict}),
    Kind.PEER_RESTARTED: _spec({"name": str}),
    Kind.DRAIN: _spec({"deadline_secs": _NUM}),
    Kind.DRAINED: _spec({"in_flight": int}),
    # only_end: a log writer answers {"end": …} alone (writer/store's `sync`); tenant: the scheduler
    # counts that tenant's own queued runs too (GET /v1/queues); workers: it lists them (GET /v1/workers)
    Kind.STATS: _spec(only_end=bool, tenant=str, workers=bool),
    Kind.STATS_REPLY: _spec({"role": str, "stats": dict}),
    Kind.ERROR: _spec({"code": str, "message": str}),
    # From the supervisor to the log writers after each renewal: acknowledge for this long at most.
    Kind.LEASE: _spec({"epoch": int, "valid_secs": _NUM}),
    # turn.* bodies all carry the turn id; events also carry their sequence number, so a
    # receiver can detect a gap and ask for a replay (turn.resume).
    # system: the turn's instructions, in place of provider.system_prompt
    # keyed: its id comes from an Idempotency-Key: a known turn is streamed again, not started anew,
    # and one the journal holds is refused (TURN_STATUS back, code turn_exists or conflict)
    # stream: the gateway's id for the client stream asking (start, resume, cancel): the turn is
    # the latest one's, and a stream cancelled once is not started or streamed again
    Kind.TURN_START: _spec({"turn_id": str, "session": str, "tenant": str, "input": str}, deadline=_NUM,
                           system=str, keyed=bool, stream=str),
    Kind.TURN_STARTED: _spec({"turn_id": str, "seq": int}, data=dict),
    Kind.TURN_DELTA: _spec({"turn_id": str, "seq": int, "text": str}),
    Kind.TURN_DONE: _spec({"turn_id": str, "seq": int}, data=dict),
    # A tool call of the turn (phase "call": name, arguments; phase "result": name, ok, result or error)
    Kind.TURN_TOOL: _spec({"turn_id": str, "seq": int, "phase": str, "name": str}, data=dict),
    Kind.TURN_FAILED: _spec({"turn_id": str, "seq": int, "code": str, "message": str}),
    Kind.TURN_CANCELLED: _spec({"turn_id": str, "seq": int, "reason": str}),
    # turn_id "" = whatever runs; after_secs: cancel then, unless a client resumes the stream first
    Kind.TURN_CANCEL: _spec({"session": str}, turn_id=str, reason=str, after_secs=_NUM, stream=str),
    Kind.TURN_RESUME: _spec({"turn_id": str, "session": str, "after": int}, stream=str),
    # Reply to a resume of a turn the actor does not know (lost in a crash) or that is alive.
    # last: an ended turn's terminal event id; approvals: the tool calls a running turn waits on
    Kind.TURN_STATUS: _spec({"turn_id": str, "state": str}, last=int, approvals=list, code=str, error=str),
    # A person's answer for a tool call a turn waits on (actors/tool_approvals.py); TURN_STATUS back
    Kind.TURN_APPROVE: _spec({"session": str, "turn_id": str, "call_id": str, "approve": bool}, reason=str),
    # Before a session's CLOSE record: its turn cancelled, the session out of memory, the actor's
    # records acknowledged (storage/session_closing.py); replied as TURN_STATUS, state "closed".
    # deadline: see past_deadline (a close the gateway answered 503 must not hold the session later)
    Kind.SESSION_CLOSE: _spec({"session": str}, deadline=_NUM),
    # gateway -> actor, once the CLOSE record is durable (or the close gave up): the session's
    # held turns may start (actors/closing.py). Replied as TURN_STATUS, state "closed": it is sent
    # until the actor takes it, since a lost one held the session's next turns for HOLD_SECS.
    Kind.SESSION_CLOSED: _spec({"session": str}),
    # gateway -> the new session's actor: begin `session` with the first `messages` messages of
    # `source` (none given: all, less a tool call whose results are not all in), in one full
    # checkpoint, if `session` has none (actors/session_forks.py). deadline: see past_deadline.
    Kind.SESSION_FORK: _spec({"session": str, "tenant": str, "source": str}, messages=int, deadline=_NUM),
    Kind.SESSION_FORKED: _spec({"ok": bool}, messages=int, code=str, error=str),
    # gateway -> actor: the session's running turn, replied as TURN_STATUS: state "running" (its
    # stream may be followed), "resumed" (finishing after its actor's restart: no stream to
    # follow) or "idle" (turn_id "").
    Kind.SESSION_STATUS: _spec({"session": str}),
    Kind.PERMIT_REQUEST: _spec({"permit_id": str, "tenant": str}),
    Kind.PERMIT_GRANT: _spec({"permit_id": str}),
    Kind.PERMIT_RELEASE: _spec({"permit_id": str}, backoff_secs=_NUM),
    # backoff_secs: what is left of the holder's last provider back-off (actors/permit_client.py)
    Kind.PERMIT_SYNC: _spec({"held": list, "waiting": list, "incarnation": int}, backoff_secs=_NUM),
    # priority: lower numbers are admitted first (0 if none)
    Kind.QUEUE_REQUEST: _spec({"queue": str, "run_id": str, "tenant": str}, priority=int),
    # window_secs: the queue's rate window, for which the actor reports the run's admission in its syncs
    Kind.QUEUE_GRANT: _spec({"queue": str, "run_id": str}, window_secs=_NUM),
    Kind.QUEUE_RELEASE: _spec({"queue": str, "run_id": str}),
    # queues: {queue: {"held": [run id], "waiting": [[run id, tenant(, priority)]], "started": [[run id, secs ago]]}},
    # every queue the actor has runs in; "started": its admissions within the queue's rate window
    Kind.QUEUE_SYNC: _spec({"queues": dict, "incarnation": int}),
    # Each record is [kind, id, body]: framed and written by the writer without decoding the body.
    Kind.LOG_APPEND: _spec({"records": list}, sync=bool),  # sync: someone waits for this ack
    Kind.LOG_ACK: _spec({"position": int, "count": int}),
    Kind.LOG_FLUSHED: _spec({"writer": int, "position": int}, count=int),
    # writer/store -> a log's writer: the bytes of all the logs it has yet to load
    # (storage/free_space.py keeps room for them on a shared disk)
    Kind.LOG_LOADED: _spec({"behind": int}, counted=int),   # counted: where the store took this log to end
    # writer/store -> a log's writer: the record at `position` is damaged; write the bucket's copy
    # over it (storage/bucket_mending.py). Replied with the bytes written (0: not mended, `why`;
    # `retry`: the bucket is out of reach for now; `whole`: nothing to mend there, read it).
    Kind.LOG_MEND: _spec({"position": int}),
    Kind.LOG_MENDED: _spec({"bytes": int}, why=str, retry=bool, whole=bool),
    # query: messages, events, sessions (`session`: the cursor, the id to list after), checkpoint_chain,
    # blob_latest, blob_filter, flow_records, open_runs, expired_runs, recent_admissions, count, log_ends (see
    # storage/store_queries.py `QUERIES`), runs (`session`: the run id to list after; `flow`,
    # `status`: one of RUN_STATUSES);
    # `sync`: answer once the store has loaded everything in the logs now; `sync_to` ([[log, position],
    # ...]): once it has loaded that far (a reader that knows what it has not seen yet).
    Kind.STORE_QUERY: _spec({"query": str, "session": str}, tenant=str, turn=str, after=int, limit=int,
                            before=int, desc=bool, sync=bool, sync_to=list, flow=str, status=str, at=_NUM,
                            since=_NUM, until=_NUM, queue=str, queue_key=str, schedule=str),
    Kind.STORE_ROWS: _spec({"rows": list}, next_after=(int, str), error=str),   # a position, or a session id
    # Delete the rows of these runs (their retention is over and the log no longer has them).
    Kind.STORE_PURGE: _spec({"runs": list}),
    # Where log `writer` holds, in [start, end), an external checkpoint older than its session's
    # newest one the store has loaded (rows: [position, session, seq], by position): they can
    # leave the log.
    Kind.STORE_SUPERSEDED: _spec({"writer": int, "start": int, "end": int}),
    # Delete the rows of those checkpoints, by the positions named, once the log no longer has them
    # (rows: [count]).
    Kind.STORE_FORGET: _spec({"writer": int, "start": int, "end": int, "positions": list}),
    # Where log `writer` holds, before `end`, records of closed sessions (rows: [position, session,
    # closed at], by position; at most a few thousand an answer)…
    Kind.STORE_CLOSED: _spec({"writer": int, "end": int}),
    # …and that its compaction dropped those in [start, end) (rows: [count]).
    Kind.STORE_FORGET_CLOSED: _spec({"writer": int, "start": int, "end": int}),
    # Values of flows (inputs, results, attributes, messages) are any msgpack value.
    # new: the id was generated by the caller's side just now (no need to look for an older run).
    # deadline (here, in FLOW_CANCEL, CHANNEL_PUBLISH, CHANNEL_BROADCAST and ATTR_UPDATE): see past_deadline
    # A start names its flow; a fork (actors/run_forks.py) names the run it forks instead, and
    # the operation it goes on from (fork_seq; none: the first that did not succeed). start_at:
    # a delayed start's time (epoch seconds); the run is not dispatched before it. schedule,
    # scheduled_at: the schedule that starts it, and for which of its times (actors/schedules.py).
    # timeout_secs: the run is cancelled if it has not ended this long after it began. queue: the
    # flow queue it waits in for a place, priority: before the runs there of higher numbers,
    # queue_key: its key in a queue per key (actors/flow_queues.py).
    Kind.FLOW_START: _spec({"run_id": str, "tenant": str}, flow=str, input=object, parent=str, parent_seq=int,
                           parent_actor=str, new=bool, deadline=_NUM, fork_of=str, fork_seq=int, start_at=_NUM,
                           schedule=str, scheduled_at=_NUM, timeout_secs=_NUM, queue=str, priority=int,
                           queue_key=str),
    Kind.FLOW_GET: _spec({"run_id": str, "tenant": str}, wait=_NUM),  # wait: seconds to wait for the end
    # A run's operations (steps, sleeps, waits, children, attribute writes) after seq `after`, in
    # order; a page holds at most `limit` of them and about STEPS_PAGE_BYTES of their values.
    # only: ops of that kind (`emit`: what GET /v1/runs/{id}/emitted reads); wait: seconds to wait
    # for one past `after` (an emit) or the run's end, if none is there; the answer's status: the run's
    Kind.FLOW_STEPS: _spec({"run_id": str, "tenant": str}, after=int, limit=int, only=str, wait=_NUM),
    Kind.FLOW_OPS: _spec({"found": bool}, ops=list, next_after=int, error=str, code=str, status=str),
    Kind.FLOW_CANCEL: _spec({"run_id": str, "tenant": str}, why=str, deadline=_NUM),  # why: the reason its end records
    Kind.FLOW_RUN: _spec({"run_id": str, "status": str}, flow=str, created=bool, result=object, error=str,
                         code=str, started_at=_NUM, ended_at=_NUM, parent=str, forked_from=str, fork_seq=int,
                         start_at=_NUM, schedule=str, scheduled_at=_NUM, timeout_at=_NUM),
    # results_due (here and in STEP_START): seqs of the ASYNC results the worker has sent and has no
    # answer for; the run does not park or end before they are in (actors/worker_requests.py)
    Kind.FLOW_COMPLETE: _spec({"run_id": str, "exec": int, "ok": bool}, result=object, error=str, results_due=list),
    Kind.FLOW_ACK: _spec({"ok": bool}, error=str, code=str),
    Kind.FLOW_CHILD_DONE: _spec({"run_id": str, "seq": int, "child": str, "ok": bool}, result=object, error=str),
    # op: step, sleep, wait, child, attr_set, patch (`ctx.patched`), send, publish, emit; with the op's own
    # fields (see actors/worker_requests.py)
    Kind.STEP_START: _spec({"run_id": str, "exec": int, "seq": int, "op": str, "name": str}, sync=bool,
                           max_attempts=int, due=_NUM, channel=str, channels=list, timeout=_NUM, flow=str,
                           input=object, child=str, key=str, value=object, results_due=list, queue=str,
                           priority=int, queue_key=str, target=str, message=object, where=dict),
    # action: run (attempt), replay (recorded outcome), suspend (wait for a timer, message or child),
    # continue (a wait/sleep already satisfied), fail (retries spent), abort (execution superseded),
    # skip (a patch where the code before it recorded another operation: the old path)
    Kind.STEP_GO: _spec({"action": str}, attempt=int, ok=bool, result=object, error=str, heartbeat=object),
    # (interrupted: its worker stopped cleanly mid-attempt, which does not count against its retries)
    Kind.STEP_RESULT: _spec({"run_id": str, "exec": int, "seq": int, "attempt": int, "ok": bool}, result=object,
                            error=str, sync=bool, name=str, final=bool, interrupted=bool),
    Kind.STEP_HEARTBEAT: _spec({"run_id": str, "exec": int, "seq": int, "attempt": int}, value=object),
    Kind.TASK_SUBMIT: _spec({"task_id": str, "kind": str, "name": str, "tenant": str}, run_id=str, exec=int,
                            payload=object),
    Kind.TASK_OFFER: _spec({"task_id": str, "kind": str, "name": str, "actor": str}, run_id=str, exec=int,
                           payload=object, tenant=str),
    Kind.TASK_DECLINE: _spec({"task_id": str}),
    Kind.TASK_DONE: _spec({"task_id": str}),
    Kind.TASK_RESULT: _spec({"task_id": str, "ok": bool}, result=object, error=str),
    # actor -> worker running it (stop it now) and -> scheduler (drop it if still queued)
    Kind.TASK_CANCEL: _spec({"task_id": str}),
    # scheduler -> actor: the worker a flow execution was given to went silent (died) with it, or
    # said goodbye as it stopped (`left`)
    Kind.TASK_LOST: _spec({"run_id": str, "exec": int, "worker": str}, left=bool),
    Kind.WORKER_HELLO: _spec({"slots": int, "running": list, "incarnation": int, "flows": list, "tools": list,
                              "handlers": list}, tool_schemas=list, draining=bool),
    Kind.WORKER_ALIVE: _spec({"runs": list, "tasks": list}),
    # worker -> scheduler as it stops (and back, the same): it is forgotten now, its runs back to
    # their actors and its tool and update tasks to the next worker, not after the silence that
    # says a worker died
    Kind.WORKER_BYE: _spec({"incarnation": int}),
    Kind.TOOLS_LIST: _spec(),
    Kind.TOOLS: _spec({"tools": list}),  # OpenAI tool schemas advertised by live workers
    Kind.TIMER_SET: _spec({"timer_id": str, "run_id": str, "due": _NUM}),
    Kind.TIMER_FIRE: _spec({"timer_id": str, "run_id": str}),
    # key: a run takes one message per key (actors/run_messages.py)
    Kind.CHANNEL_PUBLISH: _spec({"run_id": str, "tenant": str, "channel": str}, message=object, deadline=_NUM,
                                key=str),
    # to each actor: its runs of the tenant waiting on the channel now take the message (of `flow`
    # only, and only those whose attributes have the values `where` names); the answer counts them
    Kind.CHANNEL_BROADCAST: _spec({"tenant": str, "channel": str}, message=object, deadline=_NUM, key=str,
                                  flow=str, where=dict),
    Kind.CHANNEL_DELIVERED: _spec({"ok": bool, "delivered": int}, error=str, code=str),
    # the same runs, not woken: how many, and the `limit` waiting longest ({run_id, flow, since})
    Kind.CHANNEL_WAITING: _spec({"tenant": str, "channel": str}, flow=str, where=dict, limit=int),
    Kind.CHANNEL_WAITERS: _spec({"count": int, "runs": list}),
    Kind.ATTR_GET: _spec({"run_id": str, "tenant": str}, keys=list),
    Kind.ATTR_UPDATE: _spec({"run_id": str, "tenant": str, "key": str, "handler": str}, arg=object, deadline=_NUM),
    Kind.ATTR_VALUES: _spec({"found": bool}, values=dict, error=str, code=str),
    # key: `<tenant~>@sched:<name>`; name: the schedule's as its client names it
    Kind.SCHEDULE_PUT: _spec({"key": str, "tenant": str, "name": str, "flow": str, "cron": str}, timezone=str,
                             input=object, catchup_secs=_NUM, deadline=_NUM, queue=str),
    Kind.SCHEDULE_GET: _spec({"key": str, "tenant": str}),
    Kind.SCHEDULE_DELETE: _spec({"key": str, "tenant": str}, deadline=_NUM),
    Kind.SCHEDULE_LIST: _spec({"tenant": str}),
    Kind.SCHEDULE: _spec({"found": bool}, created=bool, schedule=dict, error=str, code=str),
    Kind.SCHEDULES: _spec({"schedules": list}),
}
