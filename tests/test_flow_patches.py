"""`ctx.patched`: a flow's code changes while runs of it are in flight. A run whose history the
old code made replays the old path; a run that comes to the change with the new code records a
mark and takes the new path; code that later drops the call passes over recorded marks. The
worker's side with a fake runtime, the actor's with fakes for the bus and the log (the whole
thing, old and new workers against a real tree, is in test_e2e_flow_patches.py)."""
import asyncio

from actors.flow_state import apply
from actors.sdk import FlowContext, NonDeterministic
from broker.protocol import Kind
from test_flow_results_due import from_worker, running_flows


class Runtime:
    """What a FlowContext asks of its worker: each STEP_START answered as `answers` says."""

    def __init__(self, answers: dict[str, dict] | None = None) -> None:
        self.answers = answers or {}
        self.started: list[dict] = []
        self.results: list[tuple[int, object]] = []
        self.threads = None

    async def step_start(self, ctx, fields):
        self.started.append(fields)
        return dict(self.answers.get(fields["op"], {"action": "run", "attempt": 1}))

    async def step_result(self, ctx, seq, attempt, ok, **fields):
        self.results.append((seq, fields.get("result")))


def context(journal: list[dict], runtime: Runtime | None = None) -> tuple[FlowContext, Runtime]:
    runtime = runtime or Runtime({"patch": {"action": "continue"}})
    return FlowContext(runtime, "r-1", 1, None, journal, {}), runtime


def done(seq: int, op: str, name: str, result=None) -> dict:
    return {"seq": seq, "op": op, "name": name, "ok": True, "result": result}


async def old(ctx):
    return await ctx.step(lambda: "old", name="old_step")


async def changed(ctx):
    if await ctx.patched("new-first"):
        return await ctx.step(lambda: "new", name="new_step")
    return await ctx.step(lambda: "old", name="old_step")


async def cleaned_up(ctx):   # the change once no run from before it is left: the call is gone
    return await ctx.step(lambda: "new", name="new_step")


def test_a_new_run_records_the_mark_and_takes_the_new_path():
    ctx, rt = context([])
    assert asyncio.run(changed(ctx)) == "new"
    assert [(f["seq"], f["op"], f["name"]) for f in rt.started] == [(0, "patch", "new-first"), (1, "step", "new_step")]
    assert rt.results == [(1, "new")]


def test_a_run_the_old_code_recorded_replays_the_old_path():
    ctx, rt = context([done(0, "step", "old_step", "recorded")])
    assert asyncio.run(changed(ctx)) == "recorded" and rt.started == []
    # and one that recorded the mark replays the new path
    ctx, rt = context([done(0, "patch", "new-first"), done(1, "step", "new_step", "recorded new")])
    assert asyncio.run(changed(ctx)) == "recorded new" and rt.started == []


def test_the_actor_says_skip_where_the_old_code_had_an_operation_in_flight():
    rt = Runtime({"patch": {"action": "skip"}})
    ctx, rt = context([], rt)
    assert asyncio.run(changed(ctx)) == "old"
    assert [(f["seq"], f["op"]) for f in rt.started] == [(0, "patch"), (0, "step")]   # the old step keeps seq 0


def test_code_that_dropped_the_call_passes_over_recorded_marks():
    ctx, rt = context([done(0, "patch", "new-first"), done(1, "step", "new_step", "recorded new")])
    assert asyncio.run(cleaned_up(ctx)) == "recorded new" and rt.started == []
    ctx, rt = context([done(0, "patch", "new-first")])   # the mark was the last thing recorded
    assert asyncio.run(cleaned_up(ctx)) == "new"
    assert [(f["seq"], f["op"]) for f in rt.started] == [(1, "step")] and rt.results == [(1, "new")]
    # an async step too
    ctx, rt = context([done(0, "patch", "new-first")])

    async def async_step(ctx):
        return await ctx.step(lambda: "a", name="new_step", durability="async")
    rt.step_result_nowait = lambda ctx, seq, attempt, ok, **f: rt.results.append((seq, f.get("result")))
    assert asyncio.run(async_step(ctx)) == "a" and rt.results == [(1, "a")] and rt.started == []


def test_a_patch_after_the_mark_of_one_whose_call_was_dropped_still_finds_its_own():
    async def second_change(ctx):   # "new-first" is gone; a later change is patched at the same point
        if await ctx.patched("newer"):
            return await ctx.step(lambda: "newer", name="newer_step")
        return await ctx.step(lambda: "new", name="new_step")

    ctx, rt = context([done(0, "patch", "new-first"), done(1, "patch", "newer"), done(2, "step", "newer_step", "n")])
    assert asyncio.run(second_change(ctx)) == "n" and rt.started == []
    # a run that took "new-first"'s path before "newer" existed keeps to it
    ctx, rt = context([done(0, "patch", "new-first"), done(1, "step", "new_step", "recorded new")])
    assert asyncio.run(second_change(ctx)) == "recorded new" and rt.started == []


def test_dropping_the_new_path_instead_is_still_caught():
    ctx, _ = context([done(0, "patch", "new-first"), done(1, "step", "new_step", "recorded new")])
    try:
        asyncio.run(old(ctx))
    except NonDeterministic as exc:
        assert "new_step" in str(exc)
    else:
        raise AssertionError("a run that took the new path replayed the old one")


def test_the_actor_journals_the_mark_at_the_end_of_the_history_and_skips_where_another_operation_is():
    async def main():
        flows, bus, log, run = running_flows()
        await flows.on_step_start(from_worker(Kind.STEP_START, 1, seq=0, op="patch", name="new-first"))
        assert bus.sent[-1][1:] == (Kind.STEP_GO, {"action": "continue"})
        assert [(b["type"], b["op"], b["name"]) for b in log.appended] == [("op.done", "patch", "new-first")]
        assert run.journal() == [{"seq": 0, "op": "patch", "name": "new-first", "ok": True, "result": None}]
        # asked again (a new execution replays it from its journal, but a resend may come)
        await flows.on_step_start(from_worker(Kind.STEP_START, 2, seq=0, op="patch", name="new-first"))
        assert bus.sent[-1][2]["action"] == "replay" and len(log.appended) == 1
        # the old code's step was in flight at seq 1 when its execution ended
        apply(run, {"run": "r-1", "type": "step.started", "seq": 1, "name": "old_step", "attempt": 1, "exec": 7})
        await flows.on_step_start(from_worker(Kind.STEP_START, 3, seq=1, op="patch", name="second"))
        assert bus.sent[-1][1:] == (Kind.STEP_GO, {"action": "skip"}) and len(log.appended) == 1

    asyncio.run(main())
