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
