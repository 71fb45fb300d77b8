"""Log frames for the tests of the log and of its projection (tests/test_wal.py, test_store_load.py)."""
from storage import records
from storage.records import RecordKind


def frames(n, start=0, size=100):
    return [records.frame(RecordKind.EVENT, f"id-{i}".encode(),
                          records.encode_body({"session": f"s{i % 3}", "tenant": "t", "turn": "u", "seq": i,
                                               "type": "x", "data": {"pad": "p" * size}, "at": 1.0}))
            for i in range(start, start + n)]


def flip(path, offset):
    """Damage a log file: invert the byte at `offset` (as a bad block or a stray write would)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def torn(frame, at, sector=512):
    """What a crash leaves of `frame` written at file offset `at` into a segment of zeros: the disk
    writes a sector whole or not at all, so the frame's sectors up to one it did not write. Here,
    the sectors before the last one it reaches (it must reach more than one)."""
    last = (at + len(frame) - 1) // sector * sector
    assert last > at, "a frame within one sector is written whole or not at all"
    return frame[:last - at]
