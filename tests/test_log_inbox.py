"""The direct inbox's framing (storage/log_inbox.py): whole frames out of any split of the stream."""
import random

import pytest

from broker.protocol import ProtocolError
from storage.log_inbox import FrameReader, frame


def test_frames_come_out_whole_however_the_stream_is_split():
    rng = random.Random(5)
    frames = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 3, 4, 5, 300, 5000]))) for _ in range(60)]
    wire = b"".join(frame(f) for f in frames)
    for pieces in ([wire], [wire[i:i + 1] for i in range(len(wire))]):
        reader = FrameReader()
        assert [f for piece in pieces for f in reader.feed(piece)] == frames
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(wire)), 20))
        reader = FrameReader()
        got = [f for a, b in zip([0, *cuts], [*cuts, len(wire)]) for f in reader.feed(wire[a:b])]
        assert got == frames and not reader.buf


def test_a_frame_over_the_limit_is_refused_before_it_is_read():
    reader = FrameReader(max_bytes=100)
    assert reader.feed(frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(ProtocolError):
        reader.feed((101).to_bytes(4, "big"))


def test_a_big_append_goes_whole_through_the_direct_inbox(tmp_path):
    """The direct link to a writer is a bus of its own kind: it must never put a body in shared
    memory (broker/spill.py), which the inbox does not read; a 300 KB append arrives whole."""
    import asyncio
    import logging

    from broker.protocol import Kind
    from storage.log_inbox import LogInbox
    from storage.log_link import LogLink

    endpoint = f"ipc://{tmp_path}/log-0.sock"
    log = logging.getLogger("test")

    async def go():
        got = []

        def on_append(msg):
            got.append(msg.body["records"])
            inbox.reply(msg, Kind.LOG_ACK, {"position": 1, "count": len(msg.body["records"])}, 1)

        inbox = LogInbox("writer/log/0", endpoint, on_append, log)
        await inbox.open()
        link = LogLink("actor/0", "writer/log/0", endpoint, log)
        link.open()
        record = [b"r" * 300_000]
        ack = await link.request("writer/log/0", Kind.LOG_APPEND, {"records": record}, timeout=5)
        stats = link.stats()
        await link.close()
        inbox.close()
        return got, ack.body, stats, inbox.malformed

    got, ack, stats, malformed = asyncio.run(asyncio.wait_for(go(), 20))
    assert got == [[b"r" * 300_000]] and ack == {"position": 1, "count": 1}
    assert stats["spilled"] == 0 and malformed == 0
