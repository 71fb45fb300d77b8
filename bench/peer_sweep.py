"""The turn sweep against a peer server on the same mock (`agent-os bench turns --peer opencode`).

opencode is installed into bench/.cache if missing, pointed at the mock through a custom
`@ai-sdk/openai-compatible` provider, warmed up, and driven by the same load generator (one
session per worker, full turn time: POST /session/{id}/message returns when the turn is done).
Between points it waits until opencode is idle and the mock quiet, so one point's tail never
runs into the next.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.mock_proc import MockModel
from bench.peer_opencode import TARGET_OPTIONS, OpencodeServer, ensure_opencode, tree_memory_kib, warm_up_load
from bench.peer_opencode_check import settle
from bench.turns import point_row, run_loadgen


def run_peer(name: str, mock: MockModel, sweep: list[int], args: Any, work: Path) -> list[dict]:
    if name != "opencode":
        raise SystemExit(f"unknown peer {name!r}: the peer this benchmark knows is opencode")
    rows: list[dict] = []
    binary = ensure_opencode()
    with OpencodeServer(binary) as peer:
        url = peer.start(mock.url)
        idle = tree_memory_kib(peer.pids())
        rows.append({"profile": "opencode", "kind": "memory", "sessions": 0,
                     "private_dirty_kib": idle["private_dirty_kib"], "rss_kib": idle["rss_kib"]})
        warm_up_load(url)
        extra = ["--target", "opencode"] + [x for k, v in TARGET_OPTIONS.items()
                                            for x in ("--target-option", f"{k}={v}")]
        for c in sweep:
            settle(peer, mock)
            mock.reset_stats()
            result = run_loadgen(url, c, args.duration, args.warmup, f"opencode-c{c}", work / f"opencode-{c}.json",
                                 peer.pids, f"opencode c={c}", extra)
            rows.append(point_row("opencode", c, result, mock.stats()))
    return rows
