"""The sending side's outbox (storage/log_client.py): bounded, and nothing in it is ever dropped —
appends wait for room when it is full, and ASYNC records a writer refused are sent again."""
import asyncio
import logging
import time
import types

from broker.protocol import Kind
from storage import log_client
from storage.log_client import LogClient, LogWriteError
from storage.records import RecordKind


class HeldLog:
    """An embedded writer (as the gateway's own log) that answers only when the test says so."""

    def __init__(self):
        self.bus = types.SimpleNamespace(name="writer/log/1", index=1)
        self.index = 1
        self.held = []
        self.written = []   # record ids, in the order they were acknowledged
        self.arrivals = []  # when each append came (time.monotonic())

    def on_append(self, append):
        self.held.append(append)
        self.arrivals.append(time.monotonic())

    def ack_all(self):
        held, self.held = self.held, []
        for append in held:
            self.written += [record[1] for record in append.body["records"]]
            append.answer(Kind.LOG_ACK, {"position": len(self.written), "count": len(append.body["records"])})

    def refuse_all(self):
        held, self.held = self.held, []
        for append in held:
            append.answer(Kind.ERROR, {"code": "disk_full", "message": "log write failed: No space left on device"})


def client(held, max_outstanding):
    bus = types.SimpleNamespace(name="gateway/0", incarnation=1, restart_hooks=[], log=None)
    return LogClient(bus, writers=1, log=logging.getLogger("test"), max_outstanding=max_outstanding,
                     own_log=held)


def event(n):
    return {"session": "s", "tenant": "t", "turn": "", "seq": n, "type": "x", "data": None, "at": 0.0}


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_full_outbox_makes_appends_wait_and_drops_nothing():
    async def go():
        held = HeldLog()
        log = client(held, max_outstanding=3)
        for n in range(3):
            assert await log.append(RecordKind.EVENT, event(n), "s", sync=False) is None
        fourth = asyncio.create_task(log.append(RecordKind.EVENT, event(3), "s", sync=False))
        await asyncio.sleep(log_client.ASYNC_LINGER_SECS * 3)
        assert not fourth.done() and log.outstanding == 3     # waits for room: not dropped, not past the bound
        held.ack_all()
        await asyncio.wait_for(fourth, 2)
        await asyncio.sleep(log_client.ASYNC_LINGER_SECS * 3)
        held.ack_all()
        assert len(held.written) == 4 and len(set(held.written)) == 4 and log.outstanding == 0

    asyncio.run(go())


def test_refused_async_records_are_sent_again_and_sync_ones_fail_fast(caplog):
    """…with the same ids, said once, and at once when the client drains for a shutdown."""
    async def held_again(held):
        for _ in range(100):
            if held.held:
                return
            await asyncio.sleep(0.05)

    async def go():
        held = HeldLog()
        log = client(held, max_outstanding=100)
        await log.append(RecordKind.ACCESS, event(0), "s", sync=False)
        sync = asyncio.create_task(log.append(RecordKind.EVENT, event(1), "s", sync=True))
        await settle()
        assert len(held.held) == 1 and len(held.held[0].body["records"]) == 2   # the ASYNC one rode along
        sent = held.held[0].body["records"]
        held.refuse_all()                 # a full disk
        await settle()
        error = sync.exception()
        assert isinstance(error, LogWriteError) and error.code == "disk_full"
        assert log.outstanding == 1       # the ASYNC record waits in the outbox, to be sent again
        await held_again(held)
        assert [r[1] for r in held.held[0].body["records"]] == [sent[0][1]]   # the same record, the same id
        held.refuse_all()                 # still full: tried again, and not said again
        await settle()
        assert not held.held              # the next try sleeps a second (doubling to 10 s)…
        drain = asyncio.create_task(log.drain(5.0))
        await settle()                    # …but a shutdown's drain sends it at once
        assert [r[1] for r in held.held[0].body["records"]] == [sent[0][1]]
        held.ack_all()
        assert await drain is True
        assert log.outstanding == 0 and held.written == [sent[0][1]]

    with caplog.at_level(logging.WARNING, logger="test"):
        asyncio.run(go())
    assert [r.getMessage()[:35] for r in caplog.records] == ["writer/log/1 refused 1 ASYNC record"]


def test_a_kept_record_is_sent_again_until_written_and_its_appender_waits_for_that():
    """A flow's journal record its run goes on without waiting for: a refusal fails nobody."""
    async def go():
        held = HeldLog()
        log = client(held, max_outstanding=100)
        kept = asyncio.create_task(log.append_kept(RecordKind.FLOW, event(0), "s"))
        await settle()
        assert len(held.held) == 1            # sent at once, not after the ASYNC linger
        sent = held.held[0].body["records"][0][1]
        held.refuse_all()                     # a full disk
        await settle()
        assert not kept.done() and log.outstanding == 1
        drain = asyncio.create_task(log.drain(5.0))
        await settle()
        held.refuse_all()                     # still full
        for _ in range(100):
            if held.held:
                break
            await asyncio.sleep(0.05)
        assert not kept.done() and [r[1] for r in held.held[0].body["records"]] == [sent]
        held.ack_all()                        # space is back
        assert await asyncio.wait_for(kept, 2) == 1 and await drain is True
        assert held.written == [sent] and log.outstanding == 0

    asyncio.run(go())


def test_a_drain_does_not_count_a_stall_and_leaves_the_backoff_as_it_was():
    """A session's close drains its actor's outbox. The actor stopped longer than the drain's
    timeout (SIGSTOP, a paused VM) woke to its acks unread and a drain already expired: the close
    answered "busy, try again". And once drained, refused records kept going again every half
    second for the rest of the actor's life."""
    async def held_soon(held, secs):
        for _ in range(int(secs / 0.05)):
            if held.held:
                return True
            await asyncio.sleep(0.05)
        return bool(held.held)

    async def go():
        held = HeldLog()
        log = client(held, max_outstanding=100)
        await log.append(RecordKind.ACCESS, event(0), "s", sync=False)
        assert await held_soon(held, 1.0)
        drain = asyncio.create_task(log.drain(0.5))
        await settle()
        time.sleep(1.0)                                            # the whole process stopped…
        asyncio.get_running_loop().call_later(0.05, held.ack_all)  # …its ack read a little after
        assert await drain is True and log.outstanding == 0

        # (the gaps from a refusal to the record's next send: a stall of this process only
        # lengthens them, so they are checked from below)
        await log.append(RecordKind.ACCESS, event(1), "s", sync=False)
        assert await held_soon(held, 1.0)
        refused = time.monotonic()
        held.refuse_all()                      # a full disk: tried again in half a second…
        assert await held_soon(held, 1.5) and held.arrivals[-1] - refused >= 0.45
        refused = time.monotonic()
        held.refuse_all()                      # …then in a second, not half of one again
        assert await held_soon(held, 3.0) and held.arrivals[-1] - refused >= 0.95

    asyncio.run(go())
