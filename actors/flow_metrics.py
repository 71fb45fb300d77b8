"""Flow runs and their steps in /metrics, counted as their records are appended
(actors/flow_runs.py `Flows.record`): runs started and ended by flow (and how they ended), steps
by outcome (`completed`, `failed`: their last attempt failed, `retried`: an attempt failed and
another follows, `interrupted`: its worker stopped cleanly mid-attempt), their other operations
by kind (a sleep, a wait, a child's end, a send, a publish, an emit...). Agent turns' own runs
and schedules are not counted here (turns have `agentos_turns_total`).

A flow name is a label; clients name flows, so one process labels at most MAX_FLOWS of them and
counts the rest under `_other` (each label is a series in every scrape, for good).
"""
from __future__ import annotations

from typing import Any

from agentos import metrics

MAX_FLOWS = 200
OPS = frozenset({"sleep", "wait", "child", "attr_set", "patch", "send", "publish", "emit"})   # (labels: a known few)
OTHER = "_other"
_named: set[str] = set()


def _label(flow: str) -> str:
    if flow not in _named:
        if len(_named) >= MAX_FLOWS:
            return OTHER
        _named.add(flow)
    return flow


def count(flow: str, kind: str, fields: dict[str, Any]) -> None:
    if kind == "step.done":
        metrics.inc(metrics.flow_steps.labels("completed" if fields.get("ok", True) else "failed"))
    elif kind == "step.failed":
        metrics.inc(metrics.flow_steps.labels("retried"))
    elif kind == "step.interrupted":
        metrics.inc(metrics.flow_steps.labels("interrupted"))
    elif kind == "op.done" and fields.get("op") in OPS:
        metrics.inc(metrics.flow_ops.labels(fields["op"]))
    elif kind == "run.started":
        metrics.inc(metrics.flow_runs_started.labels(_label(flow)))
    elif kind == "run.ended":
        metrics.inc(metrics.flow_runs_ended.labels(_label(flow), str(fields.get("status"))))
