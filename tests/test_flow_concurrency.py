"""Operations of one execution at once (asyncio.gather in a flow), the worker's side with a fake
runtime: each operation takes its seq when it is called, so the seqs follow the calls' order
whatever order they finish in, and a retry keeps its own; a sleep, wait or child waits for the
operations before it to finish and those after it wait for its answer, so an execution parks
only with nothing of it in flight (the actor's journal stays in order where a run parks)."""
import asyncio

from actors.flow_context import FlowContext
from actors.flow_types import Retry, Suspended


class Runtime:
    """A worker's side of the requests: each STEP_START answered after `delays[op name]` seconds
    with `answers[op kind]` (default: run it)."""

    def __init__(self, answers: dict[str, dict] | None = None, delays: dict[str, float] | None = None) -> None:
        self.answers = answers or {}
        self.delays = delays or {}
        self.log: list[tuple] = []
        self.threads = None
        self.stopping = False

    async def step_start(self, ctx, fields):
        self.log.append(("start", fields["seq"], fields["name"]))
        await asyncio.sleep(self.delays.get(fields["name"], 0))
        self.log.append(("answered", fields["seq"], fields["name"]))
        return dict(self.answers.get(fields["op"], {"action": "run", "attempt": 1}))

    async def step_result(self, ctx, seq, attempt, ok, **fields):
        self.log.append(("result", seq, fields.get("name"), ok))

    def step_result_nowait(self, ctx, seq, attempt, ok, **fields):
        self.log.append(("result", seq, fields.get("name"), ok))


def test_steps_at_once_take_seqs_in_call_order_and_a_retry_keeps_its_own():
    tries = []

    async def flaky():
        tries.append(1)
        await asyncio.sleep(0.05)
        if len(tries) == 1:
            raise RuntimeError("once")
        return "a"

    async def quick():
        return "b"

    async def flow(ctx):
        both = await asyncio.gather(ctx.step(flaky, retry=Retry(max_attempts=3, backoff_secs=0.01)), ctx.step(quick))
        return both, await ctx.step(quick, name="after")

    rt = Runtime()
    ctx = FlowContext(rt, "r-1", 1, None, [], {})
    assert asyncio.run(flow(ctx)) == (["a", "b"], "b")
    starts = [(seq, name) for kind, seq, name, *_ in rt.log if kind == "start"]
    assert starts == [(0, "flaky"), (1, "quick"), (0, "flaky"), (2, "after")], starts


def started(rt: Runtime) -> list[tuple[int, str]]:
    return [(seq, name) for kind, seq, name, *_ in rt.log if kind == "start"]


def test_a_park_waits_for_the_steps_before_it_and_those_after_it_for_its_answer():
    async def slow():
        await asyncio.sleep(0.1)
        return "slow"

    async def quick():
        return "quick"

    async def flow(ctx):
        return await asyncio.gather(ctx.step(slow), ctx.sleep(60), ctx.step(quick))

    rt = Runtime({"sleep": {"action": "suspend"}})
    ctx = FlowContext(rt, "r-1", 1, None, [], {})

    async def execution():   # as the worker runs one (actors/worker_process.py run_flow)
        try:
            await flow(ctx)
        except Suspended:
            await ctx.settled()
            return "suspended"

    assert asyncio.run(execution()) == "suspended"
    # the sleep went once the slow step's result was sent; the step after it never went (the
    # execution parked there): the next execution runs it
    assert rt.log == [("start", 0, "slow"), ("answered", 0, "slow"), ("result", 0, "slow", True),
                      ("start", 1, "sleep"), ("answered", 1, "sleep")], rt.log
    assert not any(ctx._open.values())


def test_a_step_beside_a_park_answered_at_once_goes_on_and_a_park_waits_for_a_park():
    async def quick():
        return "quick"

    async def flow(ctx):
        return await asyncio.gather(ctx.wait("go"), ctx.step(quick), ctx.sleep(0), ctx.step(quick, name="last"))

    rt = Runtime({"wait": {"action": "continue", "ok": True, "result": "msg"}, "sleep": {"action": "continue"}},
                 delays={"go": 0.05})
    ctx = FlowContext(rt, "r-1", 1, None, [], {})
    assert asyncio.run(flow(ctx)) == ["msg", "quick", None, "quick"]
    log = rt.log
    assert log.index(("answered", 0, "go")) < log.index(("start", 1, "quick"))     # after the wait's answer
    assert log.index(("result", 1, "quick", True)) < log.index(("start", 2, "sleep"))   # the sleep after the step
    assert started(rt) == [(0, "go"), (1, "quick"), (2, "sleep"), (3, "last")]


def test_a_replay_of_steps_run_at_once_finds_each_at_its_seq_whatever_order_they_finished_in():
    async def fetch(url):
        raise AssertionError("a recorded step ran again")

    async def flow(ctx):
        pages = await asyncio.gather(*(ctx.step(fetch, url, name=f"fetch-{url}") for url in ("a", "b", "c")))
        return pages, await ctx.step(lambda: "next", name="next")

    journal = [{"seq": i, "op": "step", "name": f"fetch-{u}", "ok": True, "result": u.upper()}
               for i, u in enumerate("abc")]
    rt = Runtime()
    ctx = FlowContext(rt, "r-1", 2, None, journal, {})
    assert asyncio.run(flow(ctx)) == (["A", "B", "C"], "next")
    assert started(rt) == [(3, "next")]


def test_waits_at_once_time_out_from_their_call_not_from_their_turn():
    """The second wait's turn comes when the first is over, but its timeout is counted from the
    call (as a sleep's), so both time out together, as asyncio.gather's would."""
    class Fields(Runtime):
        def __init__(self) -> None:
            super().__init__({"wait": {"action": "continue", "ok": True, "result": "m"}}, {"first": 0.3})
            self.fields: dict[str, dict] = {}

        async def step_start(self, ctx, fields):
            self.fields[fields["name"]] = fields
            return await super().step_start(ctx, fields)

    async def flow(ctx):
        return await asyncio.gather(ctx.wait("first", timeout=10), ctx.wait("second", timeout=10))

    rt = Fields()
    assert asyncio.run(flow(FlowContext(rt, "r-1", 1, None, [], {}))) == ["m", "m"]
    assert started(rt) == [(0, "first"), (1, "second")]
    first, second = rt.fields["first"], rt.fields["second"]
    assert first["timeout"] == second["timeout"] == 10
    assert abs(second["due"] - first["due"]) < 0.1   # (its turn came 0.3 s later)
