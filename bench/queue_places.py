"""What a flow queue per key costs the scheduler as its keys grow: the scheduler's own logic
(actors/flow_queues.py), timed in this process, no server.

`agent-os bench queue-places [--keys 100,1000,10000] [--actors 2,16]` makes, for each count of
keys, a queue `u=1 per key` (and `r=1@5/1s per key`, with a rate) whose every key holds one run
and has one waiting, spread over the actors, then times what the scheduler does with them:

- tick: its pass ten times a second (grants that time makes);
- sync: one actor's report of what it holds and waits for, every 2 s per actor;
- stats: the counts behind the gauges and `GET /v1/queues`, once a second.

Each is the median of `--repeat` timings, in milliseconds of this process's CPU (one scheduler's
event loop does them, so a long one delays every permit and grant behind it). A tick with the
places' waiters granted at once is not measured: it grants nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from actors.flow_queues import ADOPT_SECS, QueuePools, parse_queues, place_of
from bench.results import ResultsDir, markdown_table, pyplot

SPECS = {"limit": "u=1 per key", "limit and rate": "u=1@5/1s per key"}


def _filled(spec: str, keys: int, actors: int) -> tuple[QueuePools, dict[str, dict], float]:
    """Pools with `keys` places, each holding a run and with one waiting, the runs of key i on
    actor i % actors; and actor/0's report of its places."""
    specs = parse_queues(spec)
    now = ADOPT_SECS + 1.0
    pools = QueuePools(specs, 0.0)
    report: dict[str, dict] = {}
    for i in range(keys):
        place, actor = place_of(specs, "u", f"k{i}", "t"), f"actor/{i % actors}"
        pools.request(place, f"r{i}-0", actor, "t", now)
        pools.request(place, f"r{i}-1", actor, "t", now)
        if actor == "actor/0":
            report[place] = {"held": [f"r{i}-0"], "waiting": [[f"r{i}-1", "t"]]}
    return pools, report, now


def _ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        fn()
        times.append((time.process_time() - started) * 1000.0)
    return round(statistics.median(times), 3)


def measure(spec: str, keys: int, actors: int, repeat: int) -> dict:
    pools, report, now = _filled(spec, keys, actors)
    pools.sync("actor/0", 1, report, now)   # (its first: it looks at every place)
    clock = iter(now + 0.1 * n for n in range(1, 10 * repeat + 10))
    return {"keys": keys, "actors": actors,
            "tick_ms": _ms(lambda: pools.tick(next(clock)), repeat),
            "sync_ms": _ms(lambda: pools.sync("actor/0", 1, report, next(clock)), repeat),
            "stats_ms": _ms(lambda: pools.stats(next(clock)), repeat),
            "places_in_report": len(report)}


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (queue, actors) in sorted({(r["queue"], r["actors"]) for r in rows}):
        mine = [r for r in rows if r["queue"] == queue and r["actors"] == actors]
        for metric, style in (("tick_ms", "-"), ("sync_ms", "--")):
            ax.plot([r["keys"] for r in mine], [r[metric] for r in mine], style, marker="o",
                    label=f"{metric[:-3]}, {queue}, {actors} actors")
    ax.set_xscale("log")
    ax.set_xlabel("keys with runs")
    ax.set_ylabel("ms of the scheduler's CPU (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-os bench queue-places", description=__doc__.split("\n")[0])
    parser.add_argument("--keys", default="100,1000,10000", help="counts of keys (default: %(default)s)")
    parser.add_argument("--actors", default="2,16", help="counts of actors (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=20, help="timings per value (default: %(default)s)")
    parser.add_argument("--name", default="queue-places", help="results folder name (default: %(default)s)")
    parser.add_argument("--results-root", type=Path, default=None)
    args = parser.parse_args(argv)
    keys, actors = [int(k) for k in args.keys.split(",")], [int(a) for a in args.actors.split(",")]
    results = ResultsDir(args.name, args.results_root)
    results.write_config({"benchmark": "queue-places", "keys": keys, "actors": actors, "repeat": args.repeat,
                          "specs": SPECS})
    rows = []
    for queue, spec in SPECS.items():
        for n_actors in actors:
            for n_keys in keys:
                row = {"queue": queue, **measure(spec, n_keys, n_actors, args.repeat)}
                rows.append(row)
                results.append_row(row)
                print(f"  {row}", file=sys.stderr)
    table = markdown_table(["queue", "actors", "keys", "tick ms", "sync ms (one actor's)", "places it names",
                            "stats ms"],
                           [(r["queue"], r["actors"], r["keys"], r["tick_ms"], r["sync_ms"], r["places_in_report"],
                             r["stats_ms"]) for r in rows])
    plot(rows, results.figure_path("queue_places.png"))
    results.write_summary(f"# A flow queue per key in the scheduler\n\nEvery key holds a run and has one "
                          f"waiting; medians of {args.repeat} timings of this process's CPU.\n\n{table}\n")
    print(table)
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
