"""A fork: a new run of a run's flow and input that begins with the recorded outcomes of its
first operations, so its code replays those and goes on from operation `seq` (as DBOS's
fork_workflow, or Temporal's reset to a point, without touching the original).

What a user does with it: a run failed at a step (its retries spent on an outage, or on a bug
since fixed and deployed); a fork from that step runs it again — and what follows — with the
same input, and the steps before it are not run again (their results are the original's).

The fork begins with, all in its `run.started` record (one record: a fork that exists has all
of it, and one whose start failed has none):
- the outcomes of operations 0..seq-1 (`copied`), each with its attempts and times, as
  `GET /v1/runs/{id}/steps` shows them;
- the attributes as they were when operation `seq` began: the flow's own writes below `seq`, and
  update handlers' writes logged before that operation's first record;
- the messages the original received and did not take by a wait below `seq`, in their order: a
  wait at or past `seq` takes what the original's took, unless a message is published first.
Children of copied operations are not started again (their results are copied); a child
operation at or past `seq` starts a new child, named after the fork.

A fork may be forked in turn, from its own fork_seq or later (what it began with is the state as
of that operation; to go on from an earlier one, fork the run it was forked from).
"""
from __future__ import annotations

from typing import Any

from actors.flow_state import Op, Run, replay


class ForkRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def first_unsucceeded(run: Run) -> int:
    """The seq of the run's first operation that did not complete with success: where a fork
    asked for no seq goes on from."""
    seq = 0
    while seq in run.ops and run.ops[seq].done and run.ops[seq].ok:
        seq += 1
    return seq


def _copy(op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": op.seq, "op": op.op, "name": op.name, "ok": op.ok, "attempts": op.attempts,
                           "started_at": op.started_at, "ended_at": op.ended_at}
    if op.ok:
        out["result"] = op.result
    else:
        out["error"] = op.error
    return {**out, **op.what_for()}


def fork_fields(source_id: str, records: list[dict[str, Any]], tenant: str, seq: int | None) -> dict[str, Any]:
    """The fields of a fork's `run.started` record, from the original's journal (records in log
    order). ForkRefused if the tenant has no such run or the fork cannot begin at `seq`."""
    if not records or records[0].get("tenant") != tenant:
        raise ForkRefused("not_found", "no such run")
    source = replay(source_id, records)
    if source.flow == "turn":
        raise ForkRefused("not_forkable", "an agent turn's run is not forked: post a turn to its session")
    finished = len(source.journal())   # the operations 0..finished-1 all have an outcome
    if seq is None:
        seq = first_unsucceeded(source)
    if seq > finished:
        raise ForkRefused("not_forkable", f"operation {finished} of the run has no outcome: a fork goes on "
                                          f"from an operation at most {finished}")
    if source.forked_from and seq < source.fork_seq:
        # its first record holds the attributes and messages as of fork_seq, not of before it
        raise ForkRefused("not_forkable", f"the run is a fork that began at operation {source.fork_seq}: to "
                                          "go on from an earlier one, fork the run it was forked from")
    cut = next((i for i, r in enumerate(records)
                if r.get("type") == "run.ended" or (r.get("seq") == seq and r.get("type") != "message")),
               len(records))
    # a fork of a fork: what the first one began with counts as received before its own records
    begun = next((r for r in records if r.get("type") == "run.started"), {}) if source.forked_from else {}
    attrs: dict[str, Any] = dict(begun.get("attrs") or {})
    taken: set[tuple[str, int]] = set()
    for at, record in enumerate(records):
        kind = record.get("type")
        if kind == "attr.set":
            own = int(record.get("seq", -1))
            if 0 <= own < seq or (own < 0 and at < cut):
                attrs[record["key"]] = record.get("value")
        elif kind == "message.taken" and int(record["seq"]) < seq:
            taken.add((record["channel"], int(record["msg_seq"])))
    received = [[channel, int(msg_seq), message] for channel, msg_seq, message in begun.get("messages") or ()]
    received += [[r["channel"], int(r["msg_seq"]), r.get("message")] for r in records if r.get("type") == "message"]
    messages = [m for m in received if (m[0], m[1]) not in taken]
    fields = {"flow": source.flow, "input": source.input, "forked_from": source_id, "fork_seq": seq,
              "copied": [_copy(source.ops[s]) for s in range(seq)], "attrs": attrs, "messages": messages}
    if source.queue:   # a fork keeps to its original's limits (a rate an outside API sets, most of all)
        fields["queue"] = source.queue
        fields.update({f: getattr(source, f) for f in ("priority", "queue_key") if getattr(source, f)})
    return fields
