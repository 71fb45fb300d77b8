"""The notices between the logs and writer/store (storage/store_notices.py): coalesced to one per
interval, and none after close — a timer left behind would fire on a closed bus."""
import asyncio
from types import SimpleNamespace

from broker.protocol import Kind
from log_frames import frames
from storage import segments, store_notices
from storage.store_notices import LoadedNotices, StoreNotices
from storage.store_process import StoreService


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
        ends = {0: 900, 2: 40}                 # where it took each log to end: each hears its own
        notices = LoadedNotices(bus, lambda: (behind[0], ends), lambda: {0, 2})
        notices.moved(loaded=True)
        notices.moved()                        # one round for both
        await asyncio.sleep(0.01)
        assert bus.sent == [("writer/log/0", Kind.LOG_LOADED, {"behind": 350, "counted": 900}),
                            ("writer/log/2", Kind.LOG_LOADED, {"behind": 350, "counted": 40})]
        behind[0] = 50
        notices.moved(loaded=True)             # within the interval: waits for it
        assert notices.timer is not None and len(bus.sent) == 2
        await asyncio.sleep(store_notices.LOADED_EVERY_SECS * 1.5)
        assert bus.sent[2:] == [("writer/log/0", Kind.LOG_LOADED, {"behind": 50, "counted": 900}),
                                ("writer/log/2", Kind.LOG_LOADED, {"behind": 50, "counted": 40})]
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


def test_the_store_counts_a_log_at_least_to_where_its_newest_segment_begins(tmp_path):
    """A store stopped for seconds read the writers' notices late: its count, from them alone, was
    seconds old, and the logs took appends into the room it needed. What the log's directory lists
    is written whatever the notices said."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=4096)
    for frame in frames(40):
        log.write(frame, sync=True)
    newest = segments.list_segments(tmp_path / "wal" / "0")[-1][0]
    log.close()
    assert newest > 1000
    store = SimpleNamespace(config=SimpleNamespace(logs=2), flushed={0: 1000}, files_at_start={}, loaded={0: 600},
                            store=SimpleNamespace(wal_root=tmp_path / "wal"))
    assert StoreService.lag_ends(store) == (newest - 600, {0: newest})
    store.flushed[0] = newest + 10         # the notices are ahead of the listing
    assert StoreService.lag_ends(store) == (newest + 10 - 600, {0: newest + 10})


def test_the_store_asks_each_log_it_has_not_heard_from_for_a_while_where_it_ends(monkeypatch):
    """The broker bounces what is sent to a store stalled past its peer timeout: a quiet log's
    last `log.flushed` was lost, and the store loaded no further than the one before, for good."""
    clock = [1000.0]
    monkeypatch.setattr(store_notices, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(store_notices, "ASK_QUIET_SECS", 0.01)
    heard_at = {0: 1000.0, 2: 990.0}        # log 0 just now, log 1 never, log 2 ten seconds ago
    rounds: list[list[int]] = [[]]

    async def ask(log):
        rounds[-1].append(log)

    async def go():
        task = asyncio.ensure_future(store_notices.ask_quiet_logs(3, heard_at, ask))
        while not rounds[0]:
            await asyncio.sleep(0.005)
        rounds.append([])
        clock[0] += 1.0                      # log 0 went quiet too
        while not rounds[1]:
            await asyncio.sleep(0.005)
        task.cancel()

    asyncio.run(go())
    assert sorted(rounds[0]) == [1, 2]
    assert sorted(rounds[1]) == [0, 1, 2]


def test_an_answer_moves_how_far_the_store_loads_and_a_log_that_does_not_answer_is_skipped():
    from broker.requests import BusTimeout
    answers = {0: 5_595_226, 1: BusTimeout("restarting"), 2: "not a number"}

    async def ask_end(writer, timeout):
        answer = answers[writer]
        if isinstance(answer, Exception):
            raise answer
        return int(answer)

    durable = {}
    store = SimpleNamespace(_ask_end=ask_end, _durable=lambda w, end: durable.__setitem__(w, end))
    for writer in answers:
        asyncio.run(StoreService.ask_quiet(store, writer))
    assert durable == {0: 5_595_226}
