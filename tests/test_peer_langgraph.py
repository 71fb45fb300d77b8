"""LangGraph's Postgres checkpointer as a checkpoint-benchmark target (bench/peer_langgraph.py),
against a real private PostgreSQL: what a commit writes is what LangGraph reads back as the
thread's newest checkpoint, from any worker, and its tables live apart from the reference's."""
import asyncio
import pytest

from bench import peer_langgraph

APT_SECS = 900   # a fresh machine installs PostgreSQL first (bench.peer_pgredis.ensure_installed)


@pytest.mark.timeout(APT_SECS)
def test_a_commit_is_the_threads_newest_checkpoint_for_every_worker(postgres_installed):
    async def exercise(target):
        one, two = await target.open_worker(), await target.open_worker()
        try:
            assert await one.read_latest("agent-1") is None
            await one.commit("agent-1", 0, b"a" * 2048)
            await one.commit("agent-1", 1, b"b" * 4096)
            await two.commit("agent-2", 0, b"c" * 100)
            first = await two.read_latest("agent-1")     # another connection sees it: it is committed
            await two.commit("agent-1", 2, b"d" * 6144)  # and goes on from it
            return first, await one.read_latest("agent-1"), await one.read_latest("agent-2")
        finally:
            await one.close()
            await two.close()

    with peer_langgraph.langgraph_started(None, 30.0) as target:   # in /tmp: postgres must reach it
        first, after, other = asyncio.run(exercise(target))
        assert "redis_version" not in target.stack_info   # PostgreSQL alone
        described = target.describe()
    assert (first.task, first.nbytes) == (1, 4096)
    assert (after.task, after.nbytes) == (2, 6144)
    assert (other.task, other.nbytes) == (0, 100)
    assert described["langgraph_checkpoint_postgres"] and "aput" in described["client"]
