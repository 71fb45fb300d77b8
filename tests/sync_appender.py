"""A separate OS process that appends SYNC records one at a time (for the group-commit test):
each waits for its ack before sending the next, like an agent waiting for its checkpoint.

`python -m sync_appender ENDPOINT NAME COUNT [GO]`: with GO, it says "ready" once connected and
begins when the file GO exists, so that every appender of a test begins together."""
import asyncio
import os
import sys
import time

from broker.client import Bus
from storage.log_client import LogClient
from storage.records import RecordKind


async def main(endpoint: str, name: str, count: int, go: str = "") -> None:
    bus = Bus(name, endpoint, role="test")
    await bus.start()
    log = LogClient(bus, writers=1)
    if go:
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    for n in range(count):
        await log.append(RecordKind.EVENT, {"session": name, "tenant": "t", "turn": "", "seq": n, "type": "test",
                                            "data": None, "at": 0.0}, name, sync=True)
    await log.close()
    await bus.close()
    print("done", count, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5]))
