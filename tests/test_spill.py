"""Big bodies through shared memory (broker/spill.py): the ring's bookkeeping, what a reader
refuses, and the bus sending through a full ring or a lost message."""
import asyncio
import os
import subprocess
import sys

import pytest

from broker import codec, spill
from broker.client import Bus
from broker.protocol import Kind, ProtocolError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ring_dir(tmp_path):
    return str(tmp_path / "rings")


def read_bytes(reader, ref):
    return reader.read(ref, bytes)


def test_a_body_is_read_once_and_its_region_given_back(ring_dir):
    ring = spill.SpillRing(ring_dir, 1 << 20)
    reader = spill.SpillReader(ring_dir)
    try:
        refs = [ring.put(bytes([i]) * 100_000) for i in range(3)]
        assert ring.in_use() == 3
        assert [read_bytes(reader, ref) for ref in refs] == [bytes([i]) * 100_000 for i in range(3)]
        with pytest.raises(ProtocolError, match="no longer in its ring"):
            ring.put(b"x")   # takes the three back and zeroes their headers...
            read_bytes(reader, refs[0])   # ...so reading one again is refused, not served stale
        assert ring.in_use() == 1
    finally:
        reader.close()
        ring.close()


def test_the_ring_wraps_and_says_full_rather_than_overwrite(ring_dir):
    ring = spill.SpillRing(ring_dir, 1 << 20)
    reader = spill.SpillReader(ring_dir)
    try:
        first = [ring.put(b"a" * 300_000) for _ in range(3)]
        assert all(first) and ring.put(b"b" * 300_000) is None   # 3 x 300 KB fit in 1 MiB, a fourth does not
        read_bytes(reader, first[0])
        wrapped = ring.put(b"c" * 200_000)   # the oldest is free: the ring starts again at 0
        assert wrapped is not None and wrapped[1] == 0
        assert ring.put(b"d" * 200_000) is None   # what is free at the end is not free at the start
        assert read_bytes(reader, first[1]) == b"a" * 300_000 and read_bytes(reader, wrapped) == b"c" * 200_000
        assert ring.put(b"e" * 1_100_000) is None   # bigger than the ring
    finally:
        reader.close()
        ring.close()


def test_a_region_nobody_frees_is_taken_back_and_then_refused(ring_dir):
    clock = Clock()
    ring = spill.SpillRing(ring_dir, 1 << 20, clock=clock)
    reader = spill.SpillReader(ring_dir)
    try:
        lost = ring.put(b"l" * 600_000)   # its receiver died, say
        assert ring.put(b"m" * 600_000) is None
        clock.now += spill.RECLAIM_SECS + 1
        again = ring.put(b"n" * 600_000)
        assert again is not None and ring.reclaimed == 1
        with pytest.raises(ProtocolError, match="no longer in its ring"):
            read_bytes(reader, lost)
        assert read_bytes(reader, again) == b"n" * 600_000
    finally:
        reader.close()
        ring.close()


@pytest.mark.parametrize("ref, why", [
    ("nope", "malformed reference"),
    (["1-00000000000a", 0, 10], "malformed reference"),
    (["1-00000000000a", -1, 10, 1], "malformed reference"),
    (["1-00000000000a", 0, 10, True], "malformed reference"),
    (["../../etc/passwd", 0, 10, 1], "malformed ring name"),
    (["1-00000000000a", 0, 10, 1], "cannot be opened"),
])
def test_a_reader_refuses_bad_references_without_raising_anything_else(ring_dir, ref, why):
    os.makedirs(ring_dir, mode=0o700, exist_ok=True)
    reader = spill.SpillReader(ring_dir)
    with pytest.raises(ProtocolError, match=why):
        read_bytes(reader, ref)


def test_a_reader_refuses_places_outside_what_was_written(ring_dir):
    ring = spill.SpillRing(ring_dir, 1 << 20)
    reader = spill.SpillReader(ring_dir)
    try:
        name, at, length, seq = ring.put(b"z" * 1000)
        for bad, why in [([name, at, length, seq + 1], "no longer"), ([name, at, length + 1, seq], "no longer"),
                         ([name, 64, length, seq], "no longer"), ([name, 1 << 20, 10, seq], "past the end")]:
            with pytest.raises(ProtocolError, match=why):
                read_bytes(reader, bad)
        assert read_bytes(reader, [name, at, length, seq]) == b"z" * 1000
    finally:
        reader.close()
        ring.close()


def test_a_reader_unmaps_rings_whose_files_are_gone(ring_dir):
    first, second = spill.SpillRing(ring_dir, 1 << 20), spill.SpillRing(ring_dir, 1 << 20)
    reader = spill.SpillReader(ring_dir)
    try:
        read_bytes(reader, first.put(b"1" * 100))
        read_bytes(reader, second.put(b"2" * 100))
        assert reader.forget_gone() == 0 and len(reader.maps) == 2
        first.close()   # its process ended
        assert reader.forget_gone() == 1 and list(reader.maps) == [second.name]
    finally:
        reader.close()
        second.close()


def test_rings_of_dead_processes_are_removed_and_a_closed_one_leaves_nothing(ring_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.makedirs(ring_dir, mode=0o700)
    stale = os.path.join(ring_dir, f"{int(dead.stdout)}-0123456789ab")
    open(stale, "wb").close()
    ring = spill.SpillRing(ring_dir, 1 << 20)
    assert not os.path.exists(stale) and os.listdir(ring_dir) == [ring.name]
    assert oct(os.stat(ring.path).st_mode & 0o777) == "0o600"
    ring.close()
    assert not os.path.exists(ring_dir)


def test_a_directory_someone_else_could_enter_is_refused(ring_dir):
    os.makedirs(ring_dir, mode=0o777)
    os.chmod(ring_dir, 0o777)
    with pytest.raises(PermissionError, match="not a private directory"):
        spill.SpillRing(ring_dir, 1 << 20)
    with pytest.raises(ProtocolError, match="cannot be opened"):
        spill.SpillReader(ring_dir).read(["1-00000000000a", 0, 10, 1], bytes)


def test_spill_dir_only_for_ipc():
    assert spill.spill_dir("tcp://127.0.0.1:7600") is None
    one, two = spill.spill_dir("ipc:///tmp/x/broker.sock"), spill.spill_dir("ipc:///tmp/x/../x/broker.sock")
    assert one == two and one.startswith(spill.SHM_ROOT)


def test_codec_round_trip_of_a_spilled_envelope(ring_dir):
    ring = spill.SpillRing(ring_dir, 1 << 20)
    reader = spill.SpillReader(ring_dir)
    try:
        body = {"values": {f"k{i}": "v" * 16384 for i in range(10)}}
        envelope = codec.encode("actor/0", Kind.STATS, body, id=7, reply_to=3, session="s", turn="t")
        ref = ring.put(memoryview(envelope)[codec.body_offset(envelope):])
        small = codec.spilled(envelope, ref)
        assert len(small) < 200
        msg = codec.decode(small, "gateway/0", reader)
        assert (msg.id, msg.reply_to, msg.session, msg.turn, msg.body) == (7, 3, "s", "t", body)
        with pytest.raises(ProtocolError, match="does not read"):
            codec.decode(small, "gateway/0")   # a receiver without a reader (a tcp bus) refuses it
        garbage = ring.put(b"\xc1" * 10)   # not msgpack: refused, and its region still freed
        with pytest.raises(ProtocolError, match="not msgpack"):
            codec.decode(codec.spilled(envelope, garbage), "gateway/0", reader)
        ring.put(b"")
        assert ring.in_use() == 1
    finally:
        reader.close()
        ring.close()


def send_ten_big(endpoint, spill_bytes, sizes=(300_000,) * 10):
    """Messages of `sizes` in one loop iteration, gateway/0 to actor/0: what arrived, in order and
    whether intact; the sender's bus stats; and what its heartbeats added to the counter of big
    bodies by path."""
    from agentos import metrics
    counted = {path: metrics.bus_big_bodies.labels("gateway", path) for path in ("ring", "broker")}
    before = {path: counter._value.get() for path, counter in counted.items()}

    async def go():
        got = []
        done = asyncio.Event()

        def on_stats(msg):
            got.append((msg.body["i"], msg.body["p"] == chr(97 + msg.body["i"]) * sizes[msg.body["i"]]))
            if len(got) == len(sizes):
                done.set()

        a = Bus("gateway/0", endpoint, spill_bytes=spill_bytes, heartbeat_secs=0.05)
        b = Bus("actor/0", endpoint, {Kind.STATS: on_stats})
        await a.start()
        await b.start()
        while "actor/0" not in (await a.request("broker", Kind.PEERS, {}, timeout=5)).body["peers"]:
            await asyncio.sleep(0.05)
        for i, size in enumerate(sizes):
            a.send("actor/0", Kind.STATS, {"i": i, "p": chr(97 + i) * size})
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.2)   # a few heartbeats: the counts reach the counters
        stats = a.stats()
        await a.close()
        await b.close()
        return got, stats

    got, stats = asyncio.run(asyncio.wait_for(go(), 20))
    return got, stats, {path: counter._value.get() - before[path] for path, counter in counted.items()}


def test_a_full_ring_sends_whole_and_nothing_is_lost(broker):
    """Through a 1 MiB ring: three spilled, the rest whole through the broker, every one delivered,
    in order, intact; /metrics counts both paths."""
    got, stats, counted = send_ten_big(broker[1], 1 << 20)
    assert got == [(i, True) for i in range(10)]
    assert stats["spilled"] == 3 and stats["big_whole"] == 7
    assert counted == {"ring": 3, "broker": 7}


def test_bodies_from_16_kib_go_through_the_ring(broker):
    sizes = (4_000, spill.SPILL_MIN_BYTES - 200, spill.SPILL_MIN_BYTES, 40_000, 100)
    got, stats, counted = send_ten_big(broker[1], 1 << 20, sizes)
    assert got == [(i, True) for i in range(len(sizes))]
    assert stats["spilled"] == 2 and stats["big_whole"] == 0 and counted == {"ring": 2, "broker": 0}


def test_with_no_ring_to_be_had_big_bodies_go_whole_and_are_counted(broker, caplog):
    """A ring directory others could enter (so refused): every big body whole through the broker,
    one WARNING, nothing lost."""
    directory = spill.spill_dir(broker[1])
    os.makedirs(directory, mode=0o755)
    os.chmod(directory, 0o755)
    try:
        got, stats, counted = send_ten_big(broker[1], 1 << 20)
    finally:
        os.rmdir(directory)
    assert got == [(i, True) for i in range(10)]
    assert stats["spilled"] == 0 and stats["big_whole"] == 10
    assert counted == {"ring": 0, "broker": 10}
    assert [r.levelname for r in caplog.records if "no ring" in r.getMessage()] == ["WARNING"]


def test_a_big_request_sent_again_is_spilled_again(broker):
    """A request whose first attempt found nobody (its receiver not up yet) is sent again; the
    retry must not name the first attempt's region, which nobody will free before it is taken
    back, but carry its body anew."""
    _, endpoint = broker

    async def go():
        a = Bus("gateway/0", endpoint)
        await a.start()
        big = {"p": "q" * 200_000}
        request = asyncio.ensure_future(a.request("actor/0", Kind.STATS, big, timeout=10, attempt_secs=0.2))
        await asyncio.sleep(0.5)   # an attempt or two bounce: actor/0 is not there

        def on_stats(msg):
            b.reply(msg, Kind.STATS_REPLY, {"role": "x", "stats": {"n": len(msg.body["p"])}})

        b = Bus("actor/0", endpoint, {Kind.STATS: on_stats})
        await b.start()
        reply = await request
        stats = a.stats()
        await a.close()
        await b.close()
        return reply.body["stats"]["n"], stats

    n, stats = asyncio.run(asyncio.wait_for(go(), 20))
    assert n == 200_000 and stats["spilled"] >= 2
