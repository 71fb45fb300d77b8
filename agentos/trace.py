"""`agent-os trace`: subscribe to the broker's trace tap and print one line per routed message.

Each line: wall time, kind, source -> destination, session, turn, and the hop latency (from
the sender's clock at send to the broker's at routing; both on this host).
"""
from __future__ import annotations

import sys
import time

import zmq

from agentos.config import Config
from agentos.rundir import RunDir
from agentos.status import process_table
from broker import codec
from broker.address import bus_address
from broker.protocol import ProtocolError


def format_line(kind: str, src: str, dest: str, header: tuple, at: float) -> str:
    _, sent_at, _, session, turn = header
    stamp = time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
    hop_ms = max(0.0, (at - sent_at) * 1000.0)
    return f"{stamp} {kind:<18} {src:>12} -> {dest:<12} session={session or '-'} turn={turn or '-'} hop={hop_ms:.3f}ms"


def main(config: Config, session: str | None = None, kind: str | None = None, turn: str | None = None,
         count: int = 0, timeout_secs: float = 0.0, out=None) -> int:
    out = out or sys.stdout
    run_dir = RunDir.for_config(config)
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, (kind or "").encode())
    address = bus_address(config, run_dir)
    address.secure_client(sock)
    # Over tcp the broker lets only the node's own key read the tap: a refused handshake says so
    # here rather than leaving the command waiting for lines that never come.
    refusals = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH) if address.curve is not None else None
    sock.connect(address.trace)
    if config.broker.transport == "ipc" and process_table(run_dir) is None:
        # said, not refused: the tap is there once a server starts (a trace may begin first)
        print(f"agent-os trace: no server is running (run dir {run_dir.path}); waiting for one to start",
              file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout_secs if timeout_secs else None
    printed = 0
    try:
        while deadline is None or time.monotonic() < deadline:
            if refusals is not None and refusals.poll(0):
                print(f"agent-os trace: the broker refused this key ({config.broker.client_key or 'client'}) on "
                      "the trace tap: only the node's own key reads it", file=sys.stderr)
                return 2
            if not sock.poll(200):
                continue
            try:
                kind_s, src, dest, header, at = codec.decode_trace_record(sock.recv())
            except ProtocolError:
                continue
            if (session and header[3] != session) or (turn and header[4] != turn):
                continue
            print(format_line(kind_s, src, dest, header, at), file=out, flush=True)
            printed += 1
            if count and printed >= count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        if refusals is not None:
            sock.disable_monitor()
            refusals.close(0)
        sock.close(0)
    return 0
