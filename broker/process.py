"""The broker role: binds the bus and the trace tap in the run directory and routes until SIGTERM."""
from __future__ import annotations

import logging
import signal

from agentos import service
from agentos.config import Config
from agentos.rundir import RunDir
from broker.address import bus_address, publish_ports
from broker.server import Broker


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    stopping = False

    def on_term(signum, frame):  # only sets a flag: the loop notices within one poll
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    address = bus_address(config, run_dir)
    broker = Broker(address, peer_timeout_secs=config.broker.peer_timeout_secs)
    publish_ports(broker.router, broker.tap, run_dir)
    log.info("routing on %s (trace tap %s%s)", address.bind, address.trace_bind,
             ", CURVE: authorized keys only" if address.curve else "")
    try:
        broker.run(lambda: stopping)
    finally:
        broker.close()
    return service.EXIT_OK
