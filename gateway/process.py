"""The gateway role: the HTTP server on uvloop, wired to the bus.

With `gateway.listen` on port 0 the first start picks a free port and writes it to the run
directory; a restarted gateway binds the same port again, so clients keep their address.
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from agentos import service
from agentos.config import Config
from agentos.rundir import RunDir, write_port_file
from gateway.app import Gateway
from gateway.fast_path import FrontServer
from gateway.malformed_http import ServerLog
from broker.address import bus_address
from storage.log_writer import LogWriter


def main(config: Config, index: int, run_dir: RunDir, log: logging.Logger) -> int:
    async def run(stop: asyncio.Event) -> int:
        endpoint = bus_address(config, run_dir)
        own_log = None
        if config.gateway_log_index is not None:
            # Its records (checkpoint PUTs, access rows) group-commit here, not in another process.
            own_log = LogWriter(config, config.gateway_log_index, endpoint, log, embedded=True)
            await own_log.start()
        gateway = Gateway(config, endpoint, index, log, own_log)
        await gateway.bus.start()
        runner = web.AppRunner(gateway.make_app(), handler_cancellation=True, access_log=None,
                               logger=ServerLog(log, gateway.access))
        await runner.setup()
        host, port = config.listen_host_port
        if port == 0:
            port = run_dir.read_port("gateway") or 0
        front = FrontServer(gateway, runner.server) if config.gateway.fast_checkpoints else None
        try:
            if front is not None:
                bound = await front.start(host, port, backlog=4096)
            else:
                site = web.TCPSite(runner, host, port, backlog=4096)
                await site.start()
                bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc.strerror)
            await runner.cleanup()
            await gateway.bus.close()
            if own_log is not None:
                await own_log.stop()
            return service.EXIT_CONFIG
        write_port_file(run_dir.port_file("gateway"), bound)
        log.info("listening on http://%s:%d", host, bound)
        watcher = service.lifelong(gateway.watch())
        settler = service.lifelong(gateway.history.settle())
        await stop.wait()
        watcher.cancel()
        settler.cancel()
        if front is not None:
            await front.close()
        await runner.cleanup()
        gateway.access.flush()
        await gateway.log_client.drain(5.0)
        await gateway.log_client.close()
        if own_log is not None:
            await own_log.stop()
        await gateway.bus.close()
        return service.EXIT_OK

    return service.run(run)
