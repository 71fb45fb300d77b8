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
