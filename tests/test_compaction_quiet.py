"""Compaction waits for a quiet moment of its log (storage/compaction.py `quiet_moment`): a pass
is writer/store's DuckDB work and disk writes beside the commits, so it goes between bursts,
and under sustained load only a little late."""
from __future__ import annotations

import asyncio
import time
import types

from storage import compaction


def test_a_pass_waits_for_the_log_to_be_quiet_then_goes(monkeypatch):
    monkeypatch.setattr(compaction, "QUIET_SECS", 0.1)
    monkeypatch.setattr(compaction, "QUIET_WAIT_SECS", 5.0)
    writer = types.SimpleNamespace(last_batch_at=time.monotonic())

    async def burst() -> None:              # batches for 0.3 s, then none
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            writer.last_batch_at = time.monotonic()
            await asyncio.sleep(0.01)

    async def main() -> float:
        task = asyncio.create_task(burst())
        started = time.monotonic()
        await compaction.quiet_moment(writer)
        await task
        return time.monotonic() - started

    waited = asyncio.run(main())
    assert 0.35 <= waited < 1.0              # the burst's 0.3 s, then 0.1 s of quiet
    assert time.monotonic() - writer.last_batch_at >= 0.1


def test_under_sustained_load_a_pass_waits_only_so_long(monkeypatch):
    monkeypatch.setattr(compaction, "QUIET_SECS", 0.1)
    monkeypatch.setattr(compaction, "QUIET_WAIT_SECS", 0.3)
    writer = types.SimpleNamespace(last_batch_at=time.monotonic())

    async def load(stop: asyncio.Event) -> None:
        while not stop.is_set():
            writer.last_batch_at = time.monotonic()
            await asyncio.sleep(0.01)

    async def main() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(load(stop))
        started = time.monotonic()
        await compaction.quiet_moment(writer)
        waited = time.monotonic() - started
        stop.set()
        await task
        return waited

    waited = asyncio.run(main())
    assert 0.3 <= waited < 0.6


def test_a_quiet_log_is_compacted_at_once():
    writer = types.SimpleNamespace(last_batch_at=time.monotonic() - 10)
    started = time.monotonic()
    asyncio.run(compaction.quiet_moment(writer))
    assert time.monotonic() - started < 0.05
