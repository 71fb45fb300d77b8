"""Closed-loop load generator for turns: one session per worker, warm-up, then a measured window.

Owns: the worker loop, the measurement window, the targets (how a worker talks to one kind of
server) and how their responses are classified, and the command line. The wire work lives in
`actors.http1`; the report numbers (percentiles, rates, CPU per turn) in `bench.stats`.
Never does: start or stop the server under test, sweep over concurrency, or plot.

Cheap at 1000 workers on purpose (it shares two cores with the server): each worker keeps one
keep-alive connection on the hand-written Protocol client, request bytes are built once per worker,
delta payloads are never JSON-decoded (only the first delta's arrival time matters), and each turn
costs one timer handle instead of a wait_for task. Measured at 1000 workers, 10 events per turn:
~0.43 ms of CPU per turn, against ~1.0 ms for the same loop on aiohttp's client.

Counting rule: an attempt counts when it starts inside the window and ends by window end + turn
timeout. After the window, workers keep the load on until every turn that started inside it has
ended, so the last counted turns see the same load as the first; then workers are cancelled and
their connections closed. Uncounted turns still in flight are dropped, never waited for.

    python -m bench.loadgen --url http://127.0.0.1:8080 --concurrency 64 --duration 15 \
        --warmup 3 --json out.json
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import resource
import sys
from dataclasses import dataclass, field
from time import perf_counter

import orjson

from actors.http1 import parse_endpoint
from bench.stats import Attempt, summary_text, window_report
from bench.targets import TARGETS, SetupError, Target, Worker, make_target

EXIT_OK = 0
EXIT_USAGE = 2


@dataclass
class LoadConfig:
    url: str = "http://127.0.0.1:8080"
    concurrency: int = 64
    duration_secs: float = 15.0
    warmup_secs: float = 3.0
    input_text: str = "Say something."
    api_key: str | None = None
    session_prefix: str = "load"
    turn_timeout_secs: float = 60.0
    pause_after_429_ms: float = 50.0
    target: str = "agentos"
    # Extra constructor arguments of the target, e.g. {"provider_id": …, "model_id": …}.
    target_options: dict[str, str] = field(default_factory=dict)
    # A refused connect would otherwise spin the worker: wait this long before the next try.
    pause_after_connect_error_ms: float = 100.0
    connect_timeout_secs: float = 10.0
    max_error_samples: int = 10

    def validate(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.duration_secs <= 0 or self.warmup_secs < 0:
            raise ValueError("duration_secs must be > 0 and warmup_secs >= 0")
        if self.turn_timeout_secs <= 0 or self.connect_timeout_secs <= 0:
            raise ValueError("turn_timeout_secs and connect_timeout_secs must be > 0")
        if self.pause_after_429_ms < 0 or self.pause_after_connect_error_ms < 0:
            raise ValueError("pauses must be >= 0")
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; known: {sorted(TARGETS)}")
        parse_endpoint(self.url)


# -------------------------------------------------------------------------------------- the run
def _cpu_secs() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_fd_limit(concurrency: int) -> dict[str, int | bool]:
    """One socket per worker plus headroom; lift the soft RLIMIT_NOFILE toward the hard one."""
    needed = concurrency + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(max(needed, soft), hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    enough = soft == resource.RLIM_INFINITY or soft >= needed
    if not enough:
        print(f"loadgen: warning: file descriptor limit {soft} < {needed} needed",
              file=sys.stderr)
    return {"soft": soft, "hard": hard, "needed": needed, "enough": enough}


class _Run:
    def __init__(self, cfg: LoadConfig, target: Target) -> None:
        self.cfg, self.target = cfg, target
        self.attempts: list[Attempt] = []
        self.setup_errors: list[str] = []
        self.busy = [False] * cfg.concurrency
        self.pending: set[int] | None = None  # workers whose turn began before the window end
        self.drained = asyncio.Event()

    async def worker(self, index: int) -> None:
        cfg, target = self.cfg, self.target
        state: Worker | None = None
        # Starts are spread over the first half of the warm-up: 1000 sessions connecting and
        # sending in the same millisecond would stay phase-locked in waves for the whole run.
        await asyncio.sleep(cfg.warmup_secs / 2 * index / cfg.concurrency)
        try:
            while True:
                if state is None:
                    try:
                        state = await target.open_worker(index)
                    except SetupError as exc:
                        self.setup_errors.append(str(exc))
                        await asyncio.sleep(cfg.pause_after_connect_error_ms / 1000)
                        continue
                self.busy[index] = True
                attempt = await target.run_turn(state)
                self.busy[index] = False
                self.attempts.append(attempt)
                if self.pending is not None and index in self.pending:
                    self.pending.discard(index)
                    if not self.pending:
                        self.drained.set()
                if attempt.kind == "rejected_429":
                    await asyncio.sleep(cfg.pause_after_429_ms / 1000)
                elif attempt.connect_failed:
                    await asyncio.sleep(cfg.pause_after_connect_error_ms / 1000)
        finally:
            if state is not None:
                target.close_worker(state)

    async def execute(self) -> dict:
        cfg = self.cfg
        tasks = [asyncio.create_task(self.worker(i)) for i in range(cfg.concurrency)]
        try:
            await asyncio.sleep(cfg.warmup_secs)
            cpu0, window_start = _cpu_secs(), perf_counter()
            await asyncio.sleep(cfg.duration_secs)
            cpu1, window_end = _cpu_secs(), perf_counter()
            self.pending = {i for i, busy in enumerate(self.busy) if busy}
            if self.pending:
                # Every such turn ends by its own timer; the extra second only absorbs loop lag.
                try:
                    async with asyncio.timeout(cfg.turn_timeout_secs + 1.0):
                        await self.drained.wait()
                except TimeoutError:
                    pass
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            await self.target.close()
        for result in results:
            if isinstance(result, Exception):
                raise result  # a bug in a worker must not hide behind a plausible report
        return self.report(window_start, window_end, cpu1 - cpu0)

    def report(self, window_start: float, window_end: float, cpu_secs: float) -> dict:
        cfg = self.cfg
        config = dataclasses.asdict(cfg)
        if config["api_key"]:
            config["api_key"] = "***"
        report = {"config": config}
        report.update(window_report(self.attempts, window_start, window_end,
                                    cfg.turn_timeout_secs, cpu_secs, cfg.max_error_samples))
        report["setup_errors"] = len(self.setup_errors)
        report["error_samples"] += [{"kind": "setup", "status": 0, "message": m}
                                    for m in self.setup_errors[:3]]
        return report


async def run_load(cfg: LoadConfig, target: Target | None = None) -> dict:
    """Run one load point on the running loop and return the report dict."""
    cfg.validate()
    fd_limit = raise_fd_limit(cfg.concurrency)
    result = await _Run(cfg, target or make_target(cfg)).execute()
    result["fd_limit"] = fd_limit
    return result


def run(cfg: LoadConfig, target: Target | None = None) -> dict:
    """Synchronous wrapper: a fresh uvloop event loop per call."""
    import uvloop  # only here: importing the module must not pick the caller's loop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_load(cfg, target))


# ---------------------------------------------------------------------------------------- CLI
# flag, LoadConfig field, type, help — the defaults stay in LoadConfig, written once.
_FLAGS = (
    ("--url", "url", str, "base URL of the server under test"),
    ("--concurrency", "concurrency", int, "closed-loop workers, one session each"),
    ("--duration", "duration_secs", float, "measured window, seconds"),
    ("--warmup", "warmup_secs", float, "seconds of load before the window opens"),
    ("--input", "input_text", str, "the user message of every turn"),
    ("--api-key", "api_key", str, "sent as Authorization: Bearer KEY"),
    ("--session-prefix", "session_prefix", str, "session ids are PREFIX-<worker index>"),
    ("--turn-timeout", "turn_timeout_secs", float, "seconds until a turn counts as timeout"),
    ("--pause-after-429-ms", "pause_after_429_ms", float, "a rejected worker waits this long"),
    ("--target", "target", str, "server kind: agentos or opencode"),
)


def main(argv: list[str] | None = None) -> int:
    defaults = LoadConfig()
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen",
                                     description=__doc__.split("\n")[0])
    for flag, name, kind, text in _FLAGS:
        parser.add_argument(flag, dest=name, type=kind, default=getattr(defaults, name),
                            help=f"{text} (default: %(default)s)")
    parser.add_argument("--sessions", type=int, help="must equal --concurrency")
    parser.add_argument("--target-option", action="append", default=[], metavar="KEY=VALUE",
                        help="target constructor argument, e.g. provider_id=mock (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="write the full report here")
    args = parser.parse_args(argv)
    if args.sessions is not None and args.sessions != args.concurrency:
        parser.error("--sessions must equal --concurrency: each worker owns one session")
    options = {}
    for item in args.target_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--target-option wants KEY=VALUE, got {item!r}")
        options[key] = value
    cfg = LoadConfig(**{name: getattr(args, name) for _, name, _, _ in _FLAGS},
                     target_options=options)
    try:
        cfg.validate()
        make_target(cfg)  # rejects unknown target options before any load is sent
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    result = run(cfg)
    if args.json:
        with open(args.json, "wb") as fh:
            fh.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(summary_text(result))
    return EXIT_OK


if __name__ == "__main__":
    try:  # here, not in main(): a caller such as a test keeps its own process title
        import setproctitle
        setproctitle.setproctitle("agent-os: loadgen")
    except ImportError:  # the title is a convenience, not a requirement
        pass
    sys.exit(main())
