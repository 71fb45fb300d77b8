"""A worker says when no server answers on its bus (an ipc address made from a relative
storage.dir read in another directory otherwise left it waiting in silence); the case where one
does answer is in test_e2e_flows.py."""
import asyncio
import logging

from actors.worker_process import say_when_reached
from broker.client import Bus


def test_a_worker_whose_bus_has_no_server_says_so_and_where_to_look(tmp_path, caplog):
    address = f"ipc://{tmp_path}/broker.sock"   # no broker listens here

    async def main():
        bus = Bus("worker/test", address, role="worker")
        await bus.start()
        try:
            probe = asyncio.ensure_future(say_when_reached(bus, address, "/srv/elsewhere/data",
                                                           logging.getLogger("test"), timeout=0.3))
            await asyncio.sleep(1.0)
            assert not probe.done()   # it keeps asking: the server may start later
            probe.cancel()
        finally:
            await bus.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    (said, *_) = [r.getMessage() for r in caplog.records if "no answer" in r.getMessage()]
    assert address in said and "/srv/elsewhere/data" in said and "kernel.run_dir" in said
