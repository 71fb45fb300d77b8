"""A run's channel messages: a publish to one of its channels (HTTP, the flow client, or another
run's `ctx.send`), and `ctx.send` itself, a flow's message to another run taken once.

A publish may carry a `key` (HTTP `Idempotency-Key`; a send's is its run and place): a run takes
one message per key, and answers a publish of a key it holds as it answered the first. So a
caller that lost the answer sends again without a second message, and a send its run replays
after a crash (the target took it; the sender's record of that was lost) is taken once.

A mixin of `actors.flow_runs.Flows` (it uses `find_to_write`, `record`, `dispatch`, `given_up`,
`_take_message`).
"""
from __future__ import annotations

import asyncio
import collections
import heapq
from typing import Any, Callable

from actors.flow_state import Op, Run, next_message
from actors.run_requests import refused
from actors.schedules import SCHEDULE_FLOW
from agentos.tenant_ids import external, internal
from broker.client import BusError
from broker.protocol import Kind, Message
from broker.sharding import actor_name
from storage.log_client import LogWriteError

SEND_ATTEMPTS = 3          # a send asks the target's actor this often before its execution gives up
SEND_TIMEOUT_SECS = 15.0   # each (all of them within the 60 s a worker's resent request is kept for)
SEND_REFUSALS = ("not_found", "ended")   # the target's answers a second send would get too


_ABSENT = object()
INTERNAL_FLOWS = frozenset({"turn", SCHEDULE_FLOW})   # a broadcast is for the tenant's own flows


def _wait_for(run: Run, channel: str) -> Op | None:
    """The run's wait that a message on `channel` wakes now, if any."""
    waiting = run.ops.get(run.waiting) if run.waiting is not None else None
    return waiting if waiting is not None and waiting.listens_to(channel) and not waiting.done else None


def _waiting_on(body: dict[str, Any]) -> Callable[[Run], bool]:
    """Whether a run is one of a broadcast's (CHANNEL_BROADCAST, CHANNEL_WAITING): of its tenant,
    its flow if named, waiting on its channel now, with the attribute values its `where` names."""
    tenant, channel, flow, where = body["tenant"], body["channel"], body.get("flow"), body.get("where") or {}

    def chosen(run: Run) -> bool:
        return (run.tenant == tenant and not run.ended and not run.stale and run.flow not in INTERNAL_FLOWS
                and (flow is None or run.flow == flow) and _wait_for(run, channel) is not None
                and all(run.attrs.get(k, _ABSENT) == v for k, v in where.items()))
    return chosen


class RunMessages:
    async def on_publish(self, msg: Message) -> None:
        b = msg.body
        run = await self.find_to_write(msg, Kind.FLOW_ACK, "message not published", {"ok": False}, {"ok": False})
        if run is None:
            return
        key = b.get("key")
        if key is not None and await self._taken_already(run, key):   # (even once the run has ended)
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": True})
            return
        if run.ended:
            self.bus.reply(msg, Kind.FLOW_ACK, {"ok": False, "code": "ended", "error": f"the run is {run.status}"})
            return
        if self.given_up(msg, "found its run"):
            return
        self.bus.reply(msg, Kind.FLOW_ACK, await self._deliver(run, b["channel"], b.get("message"), key))

    async def _deliver(self, run: Run, channel: str, message: Any, key: str | None) -> dict[str, Any]:
        """The message into the run's channel, taken by its wait if one listens there; the answer
        for its publisher once it is durable."""
        # The message and, if a wait is for it, its taking go in one batch (one fsync, not two):
        # both come from this actor to one writer, in order, so the taking is never durable alone.
        msg_seq = run.msg_counter + 1
        kept = self.record(run, "message", channel=channel, msg_seq=msg_seq, message=message,
                           **({"key": key} if key is not None else {}))
        if key is not None:
            run.message_keys[key] = kept
        waiting = _wait_for(run, channel)
        taken_from = next_message(run, waiting) if waiting is not None else None
        head = (taken_from, run.channels[taken_from][0]) if taken_from is not None else None   # what the wait takes
        took = False
        try:
            if waiting is not None and await self._take_message(run, waiting):
                took = True
                self.dispatch(run)
            await kept
        except LogWriteError as exc:
            await self._unpublish(run, channel, msg_seq, kept, None if took else waiting, head)
            if key is not None and run.message_keys.get(key) is kept:
                del run.message_keys[key]
            return {"ok": False, **refused(exc, "message not published")}
        return {"ok": True}

    async def on_broadcast(self, msg: Message) -> None:
        """A publish to a channel of the tenant (`POST /v1/channels/{name}`): taken by each of its
        runs here waiting on that channel now (of a `flow`, with the attributes `where` names),
        each durably before the answer, which counts them. A run not waiting on it now does not
        get it: that is what a run's own channel is for. With a `key`, a run takes it once."""
        await self.ready.wait()
        b = msg.body
        channel = b["channel"]
        key = f"*{channel}:{b['key']}" if b.get("key") is not None else None   # (apart from a run's own keys)
        chosen = _waiting_on(b)
        runs = [run for run in self.runs.values() if chosen(run)]
        if self.given_up(msg, "found its runs"):
            return

        async def deliver(run: Run) -> dict[str, Any] | None:
            if key is not None and await self._taken_already(run, key):
                return None
            if not chosen(run):   # (it took another message, or ended, while an earlier one was written)
                return None
            return await self._deliver(run, channel, b.get("message"), key)
        answers = [a for a in await asyncio.gather(*(deliver(run) for run in runs)) if a is not None]
        refusals = [a for a in answers if not a["ok"]]
        self.bus.reply(msg, Kind.CHANNEL_DELIVERED, {**(refusals[0] if refusals else {"ok": True}),
                                                     "delivered": len(answers) - len(refusals)})

    async def on_waiting(self, msg: Message) -> None:
        """The tenant's runs here waiting on a channel now (`GET /v1/channels/{name}`): how many,
        and the `limit` that have waited longest (their ids, flows, since when)."""
        await self.ready.wait()
        chosen = _waiting_on(msg.body)
        runs = [run for run in self.runs.values() if chosen(run)]
        limit = max(0, min(msg.body.get("limit", 100), 1000))
        first = heapq.nsmallest(limit, runs, key=lambda run: run.ops[run.waiting].started_at)
        self.bus.reply(msg, Kind.CHANNEL_WAITERS, {"count": len(runs), "runs": [
            {"run_id": run.run_id, "flow": run.flow, "since": run.ops[run.waiting].started_at} for run in first]})

    @staticmethod
    async def _taken_already(run: Run, key: str) -> bool:
        """Whether the run holds a message of this key; one still being written is waited for (a
        refused one is not held: this publish goes on as the first)."""
        kept = run.message_keys.get(key)
        if kept is None or kept is True:
            return kept is True
        await asyncio.gather(kept, return_exceptions=True)
        return not kept.cancelled() and kept.exception() is None

    async def _unpublish(self, run: Run, channel: str, msg_seq: int, kept: asyncio.Future, waiting: Op | None,
                         head: tuple[str, tuple] | None) -> None:
        """Undo what a refused publish did to the run: its message, and the taking of a message by
        the wait it would have woken (the records of both go in one batch, so they fail together)."""
        written = not isinstance((await asyncio.gather(kept, return_exceptions=True))[0], BaseException)
        if not written:
            run.channels[channel] = collections.deque(m for m in run.channels.get(channel, ()) if m[0] != msg_seq)
            if run.msg_counter == msg_seq:
                run.msg_counter -= 1
        if waiting is not None and waiting.done and not run.ended:
            run.reopen(waiting)
            run.waiting = waiting.seq
            if head is not None and (written or head[1][0] != msg_seq):   # (the taken message, back in its place)
                run.channels.setdefault(head[0], collections.deque()).appendleft(head[1])

    async def _start_send(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        """`ctx.send`: the message goes to the target's actor under the key of this run and place,
        then its outcome is journaled. A target that cannot be reached leaves nothing journaled:
        the execution ends, and the run's next one sends again under the same key."""
        b = msg.body
        named, channel = b["target"], b["channel"]
        target = named if external(run.tenant, named) != named else internal(run.tenant, named)
        body = {"run_id": target, "tenant": run.tenant, "channel": channel, "message": b.get("message"),
                "key": f"{run.run_id}@{seq}"}
        reply = await self._ask_on(run, actor_name(target, self.shards), Kind.CHANNEL_PUBLISH, body, target,
                                   lambda reply: reply.body["ok"] or reply.body.get("code") in SEND_REFUSALS)
        if reply is None:
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        outcome = {"ok": True, "result": {"run_id": named, "channel": channel}} if reply.body["ok"] else \
            {"ok": False, "error": f"{reply.body.get('code')}: {reply.body.get('error', '')}"}
        await self._sent(msg, run, seq, "send", outcome)

    async def _start_publish(self, msg: Message, run: Run, seq: int, op: Op | None) -> None:
        """`ctx.publish`: a broadcast to the runs of the tenant waiting on a channel, every actor
        asked under the key of this run and place (so a run that took it does not take it again
        when a next execution publishes again), then the count of those that took it journaled."""
        b = msg.body
        body = {"tenant": run.tenant, "channel": b["channel"], "message": b.get("message"),
                "key": f"{run.run_id}@{seq}", **{f: b[f] for f in ("flow", "where") if b.get(f)}}
        replies = await asyncio.gather(*(self._ask_on(run, f"actor/{i}", Kind.CHANNEL_BROADCAST, body, "",
                                                      lambda reply: reply.body["ok"]) for i in range(self.shards)))
        if any(reply is None for reply in replies):
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        await self._sent(msg, run, seq, "publish", {"ok": True, "result": sum(r.body["delivered"] for r in replies)})

    async def _ask_on(self, run: Run, dest: str, kind: Kind, body: dict[str, Any], session: str,
                      answered: Callable[[Message], bool]) -> Message | None:
        """A run's message to another actor (its `ctx.send` or `ctx.publish`), asked SEND_ATTEMPTS
        times until `answered`; None (said in a WARNING) if it never was."""
        why = ""
        for attempt in range(SEND_ATTEMPTS):
            try:
                reply = await self.bus.request(dest, kind, body, timeout=SEND_TIMEOUT_SECS, session=session)
            except BusError as exc:
                why = str(exc)
            else:
                if answered(reply):
                    return reply
                why = reply.body.get("error", "refused")
            if attempt + 1 < SEND_ATTEMPTS:
                await asyncio.sleep(0.25 * 2 ** attempt)
        self.log.warning("run %s could not reach %s with %s (%s): its next execution sends again", run.run_id,
                         dest, kind.value, why)
        return None

    async def _sent(self, msg: Message, run: Run, seq: int, op: str, outcome: dict[str, Any]) -> None:
        """A send's or publish's outcome, journaled and answered, if the run is still this one's."""
        if run.ended or run.stale or self.runs.get(run.run_id) is not run:   # (cancelled or read back meanwhile)
            self.bus.reply(msg, Kind.STEP_GO, {"action": "abort"})
            return
        if run.ops.get(seq) is not None and run.ops[seq].done:   # (a resent request's twin got here first)
            self.bus.reply(msg, Kind.STEP_GO, {"action": "replay", "ok": run.ops[seq].ok,
                                               "result": run.ops[seq].result, "error": run.ops[seq].error})
            return
        await self.record(run, "op.done", seq=seq, op=op, name=msg.body["name"], **outcome)
        self.bus.reply(msg, Kind.STEP_GO, {"action": "continue", **outcome})
