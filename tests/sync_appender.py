"""A separate OS process that appends SYNC records one at a time (for the group-commit test):
each waits for its ack before sending the next, like an agent waiting for its checkpoint."""
import asyncio
import sys

from broker.client import Bus
from storage.log_client import LogClient
from storage.records import RecordKind


async def main(endpoint: str, name: str, count: int) -> None:
    bus = Bus(name, endpoint, role="test")
    await bus.start()
    log = LogClient(bus, writers=1)
    for n in range(count):
        await log.append(RecordKind.EVENT, {"session": name, "tenant": "t", "turn": "", "seq": n, "type": "test",
                                            "data": None, "at": 0.0}, name, sync=True)
    await log.close()
    await bus.close()
    print("done", count, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
