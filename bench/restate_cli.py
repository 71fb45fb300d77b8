"""The manual-check command line of the Restate peer: `python -m bench.peer_restate …`.

Owns: the arguments, the table printed at the end (and one line per point as it finishes, on
stderr), keeping Restate's folder when a point fails. Never does: anything the step benchmark
needs; that calls `RestateServer` and `run_scenario` directly.

    python -m bench.peer_restate --scenarios sync_steps,flows,attr_read --clients 32 \\
        --duration 10 --warmup 3 [--asgi-server granian] [--tuned] [--set KEY=VALUE]
"""
from __future__ import annotations

import argparse
import sys

from bench.peer_restate import ASGI_SERVERS, TUNED_SETTINGS, RestateServer, versions
from bench.restate_load import SCENARIOS, run_scenario


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_restate",
                                     description="Run step scenarios against a private Restate.")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, from: {', '.join(SCENARIOS)}")
    parser.add_argument("--clients", default="32",
                        help="concurrent clients; a comma-separated list runs each count")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    parser.add_argument("--asgi-server", choices=ASGI_SERVERS, default="hypercorn",
                        help="what serves the Python SDK app to Restate")
    parser.add_argument("--tuned", action="store_true",
                        help="start from TUNED_SETTINGS instead of Restate's defaults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Restate setting, a top-level key (true/false, integer or string)")
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown or not args.scenarios:
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    try:
        args.clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error(f"--clients must be integers, got {args.clients!r}")
    if min(args.clients) < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--clients must be >= 1, --duration > 0 and --warmup >= 0")
    args.settings = dict(TUNED_SETTINGS) if args.tuned else {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {item!r}")
        args.settings[key] = setting_value(value)
    return args


def setting_value(text: str) -> bool | int | str:
    """A `--set` value as TOML wants it: true/false, an integer, or else a string."""
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.isdigit() else text


def format_table(rows: list[dict]) -> str:
    """One line per row; `other cpu s` is the machine's busy CPU that was none of ours."""
    head = ("scenario", "clients", "rate", "unit", "p50 ms", "p99 ms", "errors",
            "restate cpu s", "service cpu s", "client cpu s", "other cpu s")
    body = []
    for r in rows:
        ours = r["server_cpu_secs"] + r["service_cpu_secs"] + r.get("client_cpu_secs", 0.0)
        other = r["machine_busy_secs"] - ours if "machine_busy_secs" in r else None
        body.append((r["scenario"], str(r["clients"]), f"{r['ops_per_sec']:,.0f}", r["unit"],
                     _num(r["p50_ms"]), _num(r["p99_ms"]), str(r["errors"]),
                     _num(r["server_cpu_secs"], 2), _num(r["service_cpu_secs"], 2),
                     _num(r.get("client_cpu_secs"), 2), _num(other, 2)))
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True)))
                     for line in [head, *body])


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    with RestateServer(settings=args.settings, asgi_server=args.asgi_server) as server:
        print(f"restate {versions()} ingress {server.ingress_url}", file=sys.stderr)
        try:
            for scenario in args.scenarios:
                for clients in args.clients:
                    rows.append(run_scenario(server, scenario, clients, args.warmup,
                                             args.duration))
                    print(format_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
        except BaseException:
            server.keep_files = True  # the logs are what tells why
            print(f"failed; Restate's folder and logs are kept in {server.root}", file=sys.stderr)
            raise
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
