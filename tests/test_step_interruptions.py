"""A step attempt cut short by its worker's clean stop (`interrupted`, actors/sdk.py) is journaled
as `step.interrupted` and not counted against the step's retries: only failed attempts (and
attempts whose worker died with them) are. Each interruption counts once, and only for the
attempt now running; a replay of the journal gives the same counts."""
import asyncio

from actors.flow_state import replay
from actors.worker_requests import MAX_INTERRUPTED_ATTEMPTS
from broker.protocol import Kind
from test_flow_results_due import from_worker, running_flows


class Worker:
    """What a worker asks of the run's actor for its one SYNC step `s`, and the answers."""

    def __init__(self, flows, bus, max_attempts: int) -> None:
        self.handlers, self.bus, self.max_attempts = flows.handlers(), bus, max_attempts
        self.ids = iter(range(1, 10_000))

    async def start(self) -> dict:
        await self.handlers[Kind.STEP_START](from_worker(Kind.STEP_START, next(self.ids), seq=0, op="step", name="s",
                                                         sync=True, max_attempts=self.max_attempts))
        return self.bus.sent[-1][2]

    async def result(self, attempt: int, **fields) -> None:
        await self.handlers[Kind.STEP_RESULT](from_worker(Kind.STEP_RESULT, next(self.ids), seq=0, attempt=attempt,
                                                          ok=False, sync=True, name="s", **fields))
        assert self.bus.sent[-1][1:] == (Kind.FLOW_ACK, {"ok": True})


def test_interrupted_attempts_are_journaled_once_and_leave_the_steps_retries_whole():
    async def main():
        flows, bus, log, run = running_flows()
        worker = Worker(flows, bus, max_attempts=2)
        start, result = worker.start, worker.result

        assert await start() == {"action": "run", "attempt": 1}
        await result(1, interrupted=True)
        await result(1, interrupted=True)          # sent again (its ack lost): counted once
        assert await start() == {"action": "run", "attempt": 2}
        await result(2, interrupted=True)
        await result(1, interrupted=True)          # an older attempt's, late: not the one running
        assert await start() == {"action": "run", "attempt": 3}   # two attempts, neither failed
        await result(3, error="ValueError: no")
        assert await start() == {"action": "run", "attempt": 4}   # one failed of the two it may
        await result(4, error="ValueError: no")
        spent = await start()                                       # two failed: its retries are spent
        assert spent["action"] == "replay" and spent["ok"] is False, spent
        assert "retries spent: 2 attempts failed" in spent["error"], spent

        types = [(body["type"], body.get("attempt")) for body in log.appended if body["type"].startswith("step.")]
        assert types == [("step.started", 1), ("step.interrupted", 1), ("step.started", 2), ("step.interrupted", 2),
                         ("step.started", 3), ("step.failed", 3), ("step.started", 4), ("step.failed", 4),
                         ("step.done", 4)]
        view = run.ops[0].view(run_ended=False)
        assert (view["status"], view["attempts"], view["interrupted"]) == ("failed", 4, 2), view
        again = replay("r-1", log.appended)
        assert (again.ops[0].attempts, again.ops[0].interrupted) == (4, 2)

    asyncio.run(main())


def test_a_step_its_workers_stop_under_again_and_again_fails_with_the_reason():
    """Code that stops its own worker (a SIGTERM to itself) is interrupted, not failed, every
    time: without a bound it went from worker to worker as long as workers came back."""
    async def main():
        flows, bus, log, run = running_flows()
        worker = Worker(flows, bus, max_attempts=3)
        for attempt in range(1, MAX_INTERRUPTED_ATTEMPTS + 1):
            assert await worker.start() == {"action": "run", "attempt": attempt}
            await worker.result(attempt, interrupted=True)
        ended = await worker.start()
        assert ended["action"] == "replay" and ended["ok"] is False, ended
        assert f"its workers stopped under it {MAX_INTERRUPTED_ATTEMPTS} times" in ended["error"], ended
        view = run.ops[0].view(run_ended=False)
        assert (view["status"], view["attempts"], view["interrupted"]) == ("failed", MAX_INTERRUPTED_ATTEMPTS,
                                                                           MAX_INTERRUPTED_ATTEMPTS), view
        assert replay("r-1", log.appended).ops[0].error == ended["error"]

    asyncio.run(main())
