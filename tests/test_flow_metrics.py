"""Flow runs and steps in /metrics (actors/flow_metrics.py): counted from the records a run
appends; flow names as labels up to a bound, the rest under `_other`."""
from actors import flow_metrics
from agentos import metrics


def counted(counter, *labels):
    return metrics._counts.get(counter.labels(*labels), 0)


def test_records_count_runs_by_flow_and_status_and_steps_by_outcome(monkeypatch):
    monkeypatch.setattr(flow_metrics, "_named", set())
    before = [counted(metrics.flow_runs_started, "f"), counted(metrics.flow_runs_ended, "f", "failed"),
              counted(metrics.flow_steps, "completed"), counted(metrics.flow_steps, "failed"),
              counted(metrics.flow_steps, "retried")]
    for kind, fields in (("run.started", {"flow": "f"}), ("step.started", {"seq": 0}), ("step.failed", {"seq": 0}),
                         ("step.done", {"seq": 0, "ok": True}), ("step.done", {"seq": 1, "ok": False}),
                         ("attr.set", {"key": "k"}), ("run.ended", {"status": "failed"})):
        flow_metrics.count("f", kind, fields)
    after = [counted(metrics.flow_runs_started, "f"), counted(metrics.flow_runs_ended, "f", "failed"),
             counted(metrics.flow_steps, "completed"), counted(metrics.flow_steps, "failed"),
             counted(metrics.flow_steps, "retried")]
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1, 1, 1]


def test_past_the_bound_flows_count_as_other(monkeypatch):
    monkeypatch.setattr(flow_metrics, "_named", set())
    monkeypatch.setattr(flow_metrics, "MAX_FLOWS", 2)
    other = counted(metrics.flow_runs_started, "_other")
    for name in ("a", "b", "c", "d", "a"):
        flow_metrics.count(name, "run.started", {})
    assert counted(metrics.flow_runs_started, "_other") - other == 2 and flow_metrics._named == {"a", "b"}
