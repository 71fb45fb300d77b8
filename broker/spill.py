"""Big message bodies through shared memory instead of through the broker.

A reply of ten 16 KiB attributes crossed two ZeroMQ hops (sender to broker, broker to receiver),
and each hop cost ~100 µs of CPU for 160 KiB on these machines: a copy into ZeroMQ, a copy into
the kernel, a copy out of it, a copy out of ZeroMQ, and ZeroMQ's I/O thread reading 8 KiB at a
time. Both cores went on moving bytes (bench/results/2026-12-04-spill-*). So on an ipc bus
(every peer on this host) a process writes a big body (from `SPILL_MIN_BYTES`, 16 KiB) once into
its own ring, a file in /dev/shm it maps, and sends the broker a small envelope whose header
names the place: [ring, offset, length, seq] as the header's sixth item (broker/codec.py). The
receiver maps the ring, decodes the body in place, and marks the region free; the broker routes
a few hundred bytes.

A region is written by its sender only, read once and freed by its receiver:

    u64 seq | u64 freed | u32 length | 4 bytes pad | body

The receiver checks `seq` and `length` against the header's reference before it reads and `seq`
again after (a sender that took the region back meanwhile changed it), then stores `seq` into
`freed`. The sender takes regions back in the order it gave them out, once freed or once
`RECLAIM_SECS` old (a receiver that died or was never reached), and zeroes `seq` first, so a late
reader sees the body gone and drops the message as malformed; a request is then sent again.
When the ring has no room, or no ring can be made (a small /dev/shm), the envelope goes whole
through the broker as before: spilling saves work, it is never needed for correctness.

Ring files are named `<pid>-<random>`; a new ring removes the rings of processes that no longer
exist, a closing bus its own, the supervisor those of each child that dies and the directory
when the tree stops; readers unmap the rings whose files are gone at each heartbeat.
"""
from __future__ import annotations

import collections
import hashlib
import mmap
import os
import re
import secrets
import stat
import struct
import time
from typing import Any, Callable

from broker import codec
from broker.protocol import ProtocolError

# From this envelope size on a body goes through the ring. Replies over the real bus
# (bench/bus_bodies.py; bench/results/2026-12-04-bus-bodies-dec04-thirtyeighth/), ring against
# broker: at 8 KiB 0.96x the replies/s for 1.04x the CPU; at 16 KiB even (1.02x, 0.96x; by hand
# in a slower hour 1.16-1.29x); at 32 KiB 1.17x for 0.85x; at 64 KiB 1.27x for 0.45x.
SPILL_MIN_BYTES = 16 << 10
RING_BYTES = 8 << 20          # default size of one process's ring (touched only when big bodies are sent)
MAX_RING_BYTES = 1 << 30
RECLAIM_SECS = 60.0
MAX_MAPPED_RINGS = 64
SHM_ROOT = "/dev/shm"
_HEADER = struct.Struct("<QQI4x")
_FREED_AT = 8
_ALIGN = 64
_RING_NAME = re.compile(r"[0-9]{1,10}-[0-9a-f]{12}")


def spill_dir(endpoint: str, root: str = SHM_ROOT) -> str | None:
    """The directory of the rings of the bus at `endpoint`: one per ipc socket, None over tcp
    (a peer may be on another host) or where there is no shared-memory file system."""
    if not endpoint.startswith("ipc://") or not os.path.isdir(root):
        return None
    digest = hashlib.sha256(os.path.realpath(endpoint[len("ipc://"):]).encode()).hexdigest()[:16]
    return os.path.join(root, f"agent-os-{os.getuid()}-{digest}")


def check_dir(directory: str) -> None:
    """Raise OSError unless `directory` is a real directory of ours that only we can enter: in a
    directory someone else made, they could swap a ring for a file of their own."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a private directory of this user")


def _pid_alive(pid: int) -> bool:
    """A zombie is dead here: the supervisor sweeps right after its children exit, before their
    parent (the fork server) has reaped them all."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:   # no /proc here
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_rings(directory: str) -> int:
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if _RING_NAME.fullmatch(name) and not _pid_alive(int(name.partition("-")[0])):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def remove_leftovers(endpoint: str, rmdir: bool = True) -> None:
    """The rings that processes of the bus at `endpoint` left (killed ones do not remove theirs)
    and, with `rmdir` (once a tree has stopped), their directory unless a live process outside
    the tree still has a ring there."""
    directory = spill_dir(endpoint)
    if directory:
        remove_dead_rings(directory)
        try:
            if rmdir:
                os.rmdir(directory)
        except OSError:
            pass


class SpillRing:
    """One process's ring: regions handed out in order, taken back in order."""

    def __init__(self, directory: str, size: int = RING_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        if not _HEADER.size + _ALIGN <= size <= MAX_RING_BYTES:
            raise ValueError(f"ring size {size} out of range")
        self.name = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.path = os.path.join(directory, self.name)
        self.size = size
        self.clock = clock
        for attempt in range(3):   # another process may remove the directory, found empty, meanwhile
            os.makedirs(directory, mode=0o700, exist_ok=True)
            check_dir(directory)
            remove_dead_rings(directory)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            os.posix_fallocate(fd, 0, size)   # no room in /dev/shm: an error now, not SIGBUS on a write later
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self.head = 0
        self.live: collections.deque[tuple[int, int, int, float]] = collections.deque()  # (at, span, seq, when)
        self.seq = 0
        self.reclaimed = 0

    def put(self, body: Any) -> list | None:
        """Write `body` (a bytes-like object) into a free region; its reference, or None when full."""
        length = len(body)
        span = -(-(_HEADER.size + length) // _ALIGN) * _ALIGN
        self._take_back(self.clock())
        at = self._place(span)
        if at is None:
            return None
        self.seq += 1
        mm = self.mm
        _HEADER.pack_into(mm, at, self.seq, 0, length)
        mm[at + _HEADER.size:at + _HEADER.size + length] = body
        self.live.append((at, span, self.seq, self.clock()))
        self.head = at + span
        return [self.name, at, length, self.seq]

    def _place(self, span: int) -> int | None:
        if not self.live:
            self.head = 0
            return 0 if span <= self.size else None
        head, tail = self.head, self.live[0][0]
        if head > tail:   # in use: [tail, head); free: [head, size) and [0, tail)
            if head + span <= self.size:
                return head
            return 0 if span <= tail else None
        if head < tail and head + span <= tail:   # in use: [tail, size) and [0, head)
            return head
        return None       # head == tail with regions in use: full

    def _take_back(self, now: float) -> None:
        live, mm = self.live, self.mm
        while live:
            at, _, seq, when = live[0]
            if _HEADER.unpack_from(mm, at)[1] != seq:
                if now - when < RECLAIM_SECS:
                    return
                self.reclaimed += 1
            _HEADER.pack_into(mm, at, 0, 0, 0)   # gone, for a reader that comes late
            live.popleft()

    def in_use(self) -> int:
        return len(self.live)

    def close(self) -> None:
        """Unmap and remove the ring, and its directory if no other ring is left in it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.mm.close()
        try:
            os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass


class SpillReader:
    """The rings of other processes, mapped as their references arrive."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
        self.dir_checked = False

    def read(self, ref: Any, decode: Callable[[memoryview], Any]) -> Any:
        """`decode(body)` of the region `ref` names, then the region freed. Raises ProtocolError
        for a malformed reference or a body no longer there."""
        if not (isinstance(ref, list) and len(ref) == 4 and isinstance(ref[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ref[1:])):
            raise ProtocolError("spilled body: malformed reference")
        name, at, length, seq = ref
        mm = self._mapped(name)
        end = at + _HEADER.size + length
        if end > len(mm):
            raise ProtocolError("spilled body: reference past the end of its ring")
        head_seq, _, head_length = _HEADER.unpack_from(mm, at)
        if head_seq != seq or head_length != length or seq == 0:
            raise ProtocolError("spilled body: no longer in its ring (taken back by its sender)")
        view = memoryview(mm)[at + _HEADER.size:end]
        try:
            value = decode(view)
        finally:
            view.release()
            if _HEADER.unpack_from(mm, at)[0] == seq:
                struct.pack_into("<Q", mm, at + _FREED_AT, seq)
            else:
                raise ProtocolError("spilled body: taken back by its sender while being read")
        return value

    def _mapped(self, name: str) -> mmap.mmap:
        mm = self.maps.get(name)
        if mm is not None:
            self.maps.move_to_end(name)
            return mm
        if not _RING_NAME.fullmatch(name):
            raise ProtocolError("spilled body: malformed ring name")
        try:
            if not self.dir_checked:
                check_dir(self.directory)
                self.dir_checked = True
            fd = os.open(os.path.join(self.directory, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ProtocolError(f"spilled body: its ring cannot be opened ({exc.strerror or exc})") from None
        try:
            size = os.fstat(fd).st_size
            if not _HEADER.size < size <= MAX_RING_BYTES:
                raise ProtocolError("spilled body: its ring has an impossible size")
            mm = mmap.mmap(fd, size)
        except OSError as exc:
            raise ProtocolError(f"spilled body: its ring cannot be mapped ({exc})") from None
        finally:
            os.close(fd)
        self.maps[name] = mm
        while len(self.maps) > MAX_MAPPED_RINGS:
            _, old = self.maps.popitem(last=False)
            old.close()
        return mm

    def forget_gone(self) -> int:
        """Unmap the rings whose files are gone (their process ended): a mapping would keep a dead
        ring's pages alive, counted to this process, until it fell out of the cache."""
        if not self.maps:
            return 0
        try:
            present = set(os.listdir(self.directory))
        except FileNotFoundError:
            present = set()
        gone = [name for name in self.maps if name not in present]
        for name in gone:
            self.maps.pop(name).close()
        return len(gone)

    def close(self) -> None:
        for mm in self.maps.values():
            mm.close()
        self.maps.clear()


class Spiller:
    """A bus's side of it: its own ring, made at its first big body, and its reader of others'."""

    def __init__(self, endpoint: str, ring_bytes: int, log) -> None:
        self.directory = spill_dir(endpoint)
        self.reader = SpillReader(self.directory) if self.directory else None
        self.ring_bytes = ring_bytes if self.directory else 0
        self.ring: SpillRing | None = None
        self.no_ring = False   # it could not be made: every big body goes whole
        self.log = log
        self.spilled = 0
        self.whole = 0         # big bodies sent whole through the broker: the ring full, or none to be had

    def wants(self, envelope: bytes) -> bool:
        return bool(self.ring_bytes) and len(envelope) >= SPILL_MIN_BYTES

    def out(self, envelope: bytes) -> bytes:
        """`envelope` with its body in the ring, or as it is (no room, or no ring to be had)."""
        ring = self.ring
        if ring is None and not self.no_ring:
            try:
                ring = self.ring = SpillRing(self.directory, self.ring_bytes)
            except (OSError, ValueError) as exc:
                self.no_ring = True
                self.log.warning("big messages go whole through the broker: no ring in %s (%s)", self.directory, exc)
        ref = ring.put(memoryview(envelope)[codec.body_offset(envelope):]) if ring is not None else None
        if ref is None:
            self.whole += 1
            return envelope
        self.spilled += 1
        return codec.spilled(envelope, ref)

    def forget_gone(self) -> None:
        if self.reader is not None:
            self.reader.forget_gone()

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.reader is not None:
            self.reader.close()
