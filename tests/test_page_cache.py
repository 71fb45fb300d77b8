"""What writer/store has read from the log, or made durable in its payload segments, leaves the
page cache (storage/segments.py `drop_behind`): on a VM whose free memory goes back to the host,
new pages are cold, and a cache that only grows keeps taking new ones. Real files, mincore."""
import ctypes
import mmap
import os

from log_frames import frames
from storage import segments, spares
from storage.payload_segments import PayloadSegments


def cached_pages(path) -> list[bool]:
    """Which of the file's pages are in the page cache (mincore over a read-only shared mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [bool(b & 1) for b in vec.raw[:pages]]
        finally:
            libc.munmap(addr, size)


def test_the_reader_leaves_what_it_has_read_out_of_the_page_cache(tmp_path):
    """writer/store reads each durable record once: those pages go from the cache, so new pages
    (a spare's zeros, the next records) reuse them instead of growing the cache (segments.drop_behind).
    The segment is zeroed ahead as the log does, so its folios are a zeroing write's size."""
    data = frames(40, size=3000)
    log = segments.SegmentLog(tmp_path, segment_bytes=1 << 20)
    for i in range(0, 40, 4):
        log.write(data[i:i + 4], sync=True)
    log.close()
    ((_, path),) = segments.list_segments(tmp_path)
    page, folio = mmap.PAGESIZE, spares.ZERO_WRITE
    assert all(cached_pages(path))                    # zeroed, then written
    reader = segments.SegmentReader(tmp_path, 0)
    first = reader.read(20 * len(data[0]))
    middle = first[-1][4]
    cached = cached_pages(path)
    # read: gone, but for the folio the read ended in; unread: kept
    assert not any(cached[:middle // folio * folio // page]) and all(cached[-(-middle // folio) * folio // page:])
    rest = reader.read(1 << 20)
    assert [r[2] for r in first + rest] == [f"id-{i}".encode() for i in range(40)]
    assert not any(cached_pages(path)[:reader.position // folio * folio // page])
    again = segments.SegmentReader(tmp_path, 0).read(1 << 20)   # still on disk, the same
    assert [(r[2], r[3]) for r in again] == [(r[2], r[3]) for r in first + rest]


def test_payloads_leave_the_page_cache_once_durable_and_read_back_the_same(tmp_path):
    payloads = PayloadSegments(tmp_path / "payloads")
    payloads.open({})
    data = [os.urandom(20 << 10) for _ in range(30)]      # 600 KB, page-aligned: no partial page at the end
    places = [payloads.loader.append(d) for d in data]
    payloads.loader.sync()
    path = payloads.path(payloads.loader.number)
    assert os.path.getsize(path) == 30 * (20 << 10) and not any(cached_pages(path))
    assert [payloads.read(at, length) for at, length in places] == data
    more = os.urandom(20 << 10)                           # the appender goes on after them
    at, length = payloads.loader.append(more)
    payloads.loader.sync()
    assert payloads.read(at, length) == more and payloads.read(*places[0]) == data[0]
    payloads.close()


def test_a_cut_reads_only_the_heads_of_the_records_it_drops_and_leaves_its_copy_uncached(tmp_path):
    """Compaction's cut (storage/segment_rewrites.py) checks each named checkpoint by its head:
    the superseded payloads, most of a segment, are not read back from disk; what it writes
    leaves the cache once durable."""
    from storage import records, segment_rewrites

    def blob(session, seq, payload):
        return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq,
                                    "payload": payload, "at": 1.0})
    log = segments.SegmentLog(tmp_path, segment_bytes=4 << 20)
    for seq in range(1, 31):   # 30 checkpoints of 64 KB of one session: the last one stays
        log.write(records.frame(records.RecordKind.BLOB, f"r{seq}".encode(), blob("s", seq, os.urandom(64 << 10))),
                  sync=True)
    length = log.end
    log.close()
    ((_, path),) = segments.list_segments(tmp_path)
    data = path.read_bytes()
    offsets = [(off, end) for off, _, _, _, end in records.scan(data)]
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert not any(cached_pages(path)[:length // mmap.PAGESIZE])

    named = [(off, "s", seq) for seq, (off, _) in enumerate(offsets[:-1], start=1)]
    assert segment_rewrites.cut_records(path, named, length) == (29, 0)
    cached = cached_pages(path)
    page = mmap.PAGESIZE
    payload_pages = [p for off, end in offsets[:-1] for p in range(off // page + 2, end // page - 1)]
    assert len(payload_pages) > 300 and not any(cached[p] for p in payload_pages)
    copy = path.with_suffix(segment_rewrites.SUFFIX)
    assert not any(cached_pages(copy)[:-1])          # (the page it ends in may stay)
    kept_from, kept_to = offsets[-1]
    assert copy.read_bytes() == data[kept_from:kept_to]
