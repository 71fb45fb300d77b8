"""The notices between the logs and writer/store (storage/store_notices.py): coalesced to one per
interval, and none after close — a timer left behind would fire on a closed bus."""
import asyncio

from broker.protocol import Kind
from storage import store_notices
from storage.store_notices import LoadedNotices, StoreNotices


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Kind, dict]] = []
        self.closed = False

    def send(self, dest, kind, body):
        if self.closed:
            raise AssertionError("sent on a closed bus")
        self.sent.append((dest, kind, body))
        return len(self.sent)


def test_notices_are_coalesced_and_close_sends_the_pending_one_and_stops(monkeypatch):
    import types

    # The clock moves only when the test moves it: a stall of this machine between two calls
    # must not put them in different intervals (the timers still run on the loop's own clock).
    clock = [1000.0]
    monkeypatch.setattr(store_notices, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    async def go():
        bus = FakeBus()
        notices = StoreNotices(bus, 3)
        notices.written(100, 2)                 # the first goes at once
        notices.written(250, 5)                 # these two wait for the interval…
        notices.written(400, 1)
        assert [b for _, _, b in bus.sent] == [{"writer": 3, "position": 100, "count": 2}]
        await asyncio.sleep(store_notices.EVERY_SECS * 3)
        assert bus.sent[-1][2] == {"writer": 3, "position": 400, "count": 6}   # …and go as one
        clock[0] = notices.sent_at + 1.0        # a second after that notice
        notices.written(500, 4)                 # the interval has passed: at once
        notices.written(550, 1)                 # within it: waits…
        assert len(bus.sent) == 3 and notices.timer is not None
        notices.close()                         # …and goes now, as the writer stops
        bus.closed = True
        assert bus.sent[-1][1] == Kind.LOG_FLUSHED and bus.sent[-1][2] == {"writer": 3, "position": 550, "count": 1}
        notices.written(600, 1)                 # a batch finishing after close: nothing scheduled
        await asyncio.sleep(store_notices.EVERY_SECS * 3)
        assert len(bus.sent) == 4

    asyncio.run(go())


def test_the_store_tells_each_open_log_what_it_has_yet_to_load():
    async def go():
        bus = FakeBus()
        behind = [350]
        notices = LoadedNotices(bus, lambda: behind[0], lambda: {0, 2})
        notices.moved(loaded=True)
        notices.moved()                        # one round for both
        await asyncio.sleep(0.01)
        assert bus.sent == [("writer/log/0", Kind.LOG_LOADED, {"behind": 350}),
                            ("writer/log/2", Kind.LOG_LOADED, {"behind": 350})]
        behind[0] = 50
        notices.moved(loaded=True)             # within the interval: waits for it
        assert notices.timer is not None and len(bus.sent) == 2
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert bus.sent[2:] == [("writer/log/0", Kind.LOG_LOADED, {"behind": 50}),
                                ("writer/log/2", Kind.LOG_LOADED, {"behind": 50})]
        notices.moved()                        # nothing loaded, nothing new to tell: nothing sent…
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert len(bus.sent) == 4
        notices.moved(loaded=True)             # …but a load is told though the count is the same:
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)   # the disk lost before it is in it now
        assert len(bus.sent) == 6
        notices.told = {i: (b, at - store_notices.RETELL_SECS) for i, (b, at) in notices.told.items()}
        notices.moved()                        # and the same again after a while
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert len(bus.sent) == 8
        notices.restarted(2)                   # log 2 restarted: it knows nothing, told at once
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert len(bus.sent) == 9 and bus.sent[-1][0] == "writer/log/2"
        notices.moved(loaded=True)
        notices.close()                        # the store stops: its bus is about to close
        bus.closed = True
        notices.moved(loaded=True)
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert len(bus.sent) == 9

    asyncio.run(go())
