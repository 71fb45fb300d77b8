"""The agent loop of a turn: model calls under provider permits, streamed to the turn.

A model call holds a permit from the scheduler for exactly as long as its provider stream is
open. A provider 429 releases the permit with the provider's Retry-After, so the scheduler
pauses every grant, not just this one. A call that failed before any token was streamed is
retried (up to `provider.max_retries`); one that failed mid-stream is not, since the client has
already seen part of its answer.
"""
from __future__ import annotations

import asyncio
import time

from agentos import metrics
from actors.permit_client import PermitClient
from actors.persistence import Persistence
from actors.provider import ModelResult, Provider, ProviderError
from actors.session import Session
from actors.turn import Turn


class AgentLoop:
    def __init__(self, provider: Provider, permits: PermitClient, persistence: Persistence, max_retries: int) -> None:
        self.provider = provider
        self.permits = permits
        self.persistence = persistence
        self.max_retries = max_retries

    async def model_call(self, turn: Turn, session: Session) -> ModelResult:
        retries = 0
        while True:
            permit = await self.permits.acquire(turn.tenant, turn.session_id, turn.turn_id)
            backoff = 0.0
            first_token = turn.first_token_at
            try:
                return await self.provider.call(session.messages, turn.delta)
            except ProviderError as exc:
                streamed = turn.first_token_at != first_token
                metrics.inc(metrics.provider_errors.labels(exc.kind))
                if exc.kind == "rate_limited":
                    backoff = exc.retry_after
                if streamed or not exc.retryable or retries >= self.max_retries:
                    raise
                retries += 1
            finally:
                self.permits.release(permit, backoff, turn.session_id, turn.turn_id)
            if not backoff:
                await asyncio.sleep(min(0.1 * 2 ** retries, 2.0))

    async def run(self, turn: Turn, session: Session) -> dict:
        """Run the turn to its answer; returns the data of its `turn.completed` event.

        The step's and the turn's events are appended just before the SYNC checkpoint, so they
        travel in its batch: once the checkpoint is acknowledged, they are durable too.
        """
        await self.persistence.ensure_loaded(session)
        session.messages.append({"role": "user", "content": turn.input})
        step_started = time.monotonic()
        result = await self.model_call(turn, session)
        session.messages.append({"role": "assistant", "content": result.text})
        now = time.monotonic()
        ttft_ms = (turn.first_token_at - turn.started_at) * 1000.0 if turn.first_token_at else None
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens}
        durations = {"ttft_ms": None if ttft_ms is None else round(ttft_ms, 3),
                     "total_ms": round((now - turn.started_at) * 1000.0, 3)}
        self.persistence.event_nowait(turn, "step.completed", {
            "step": 1, "kind": "model", **usage, "duration_ms": round((now - step_started) * 1000.0, 3)})
        self.persistence.event_nowait(turn, "turn.completed", {"outcome": "completed", "usage": usage,
                                                               "durations": durations})
        await self.persistence.checkpoint(session, turn)
        metrics.inc(metrics.tokens_prompt, result.prompt_tokens)
        metrics.inc(metrics.tokens_completion, result.completion_tokens)
        if ttft_ms is not None:
            metrics.observe(metrics.turn_ttft, ttft_ms)
        return {"turn_id": turn.turn_id, "session_id": session.id, "usage": usage, "durations": durations,
                "finish_reason": result.finish_reason}
