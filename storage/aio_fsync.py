"""fdatasync without blocking the event loop and without a thread: Linux AIO (`IOCB_CMD_FDSYNC`).

Why: the gateway's own log fsyncs on its event loop's thread, which then reads no request until
the disk answers; on a second thread the fsync overlapped, but handing its result back needed the
GIL from a busy loop, and that cost more than the overlap gained
(bench/results/2026-12-01-compare-gateway-fsync-thread/). An AIO fdatasync runs in a kernel worker
and reports on an eventfd the loop already polls: the loop goes on serving requests — the next
batch — while the disk syncs, and no Python thread is involved. Since Linux 4.18.

`AioFsync.open()` is None where this is not available (another OS or architecture, AIO contexts
exhausted: `fs.aio-max-nr`); callers then fdatasync inline.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import platform

log = logging.getLogger("agent-os.storage")

# syscall numbers: io_setup, io_destroy, io_getevents, io_submit
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_MAX_EVENTS = 16


class _Iocb(ctypes.Structure):
    # struct iocb, little-endian layout (aio_key then aio_rw_flags)
    _fields_ = [("data", ctypes.c_uint64), ("key", ctypes.c_uint32), ("rw_flags", ctypes.c_int32),
                ("opcode", ctypes.c_uint16), ("reqprio", ctypes.c_int16), ("fildes", ctypes.c_uint32),
                ("buf", ctypes.c_uint64), ("nbytes", ctypes.c_uint64), ("offset", ctypes.c_int64),
                ("reserved2", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("resfd", ctypes.c_uint32)]


class _Event(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64),
                ("res2", ctypes.c_int64)]


class AioFsync:
    """fdatasync calls in flight on one loop; each returns a future resolved when the disk answered."""

    def __init__(self, libc: ctypes.CDLL, numbers: tuple[int, int, int, int], ctx: ctypes.c_ulong,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._libc, self._ctx, self._loop = libc, ctx, loop
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._events = (_Event * _MAX_EVENTS)()
        self._pending: dict[int, tuple[asyncio.Future, _Iocb]] = {}
        self._next = 1
        loop.add_reader(self._eventfd, self._reap)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> AioFsync | None:
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None or not hasattr(os, "eventfd"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
        except (OSError, AttributeError):
            return None
        ctx = ctypes.c_ulong(0)
        if libc.syscall(ctypes.c_long(numbers[0]), ctypes.c_uint(_MAX_EVENTS), ctypes.byref(ctx)) != 0:
            log.warning("Linux AIO unavailable (%s): the log fsyncs inline", os.strerror(ctypes.get_errno()))
            return None
        return cls(libc, numbers, ctx, loop)

    def fdatasync(self, fd: int) -> asyncio.Future:
        """Start an fdatasync of `fd`; the future ends with None, or an OSError if it failed.
        `fd` must stay open until then."""
        token, self._next = self._next, self._next + 1
        iocb = _Iocb(data=token, opcode=_IOCB_CMD_FDSYNC, fildes=fd, flags=_IOCB_FLAG_RESFD,
                     resfd=self._eventfd)
        future = self._loop.create_future()
        ptrs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(iocb))
        if self._libc.syscall(ctypes.c_long(self._submit), self._ctx, ctypes.c_long(1), ptrs) != 1:
            errno = ctypes.get_errno()
            future.set_exception(OSError(errno, f"io_submit(fdatasync): {os.strerror(errno)}"))
            return future
        self._pending[token] = (future, iocb)
        return future

    def _reap(self) -> None:
        try:
            os.eventfd_read(self._eventfd)
        except BlockingIOError:
            return
        while self._pending:
            got = self._libc.syscall(ctypes.c_long(self._getevents), self._ctx, ctypes.c_long(0),
                                     ctypes.c_long(_MAX_EVENTS), self._events, None)
            if got <= 0:
                break
            for event in self._events[:got]:
                future, _ = self._pending.pop(event.data, (None, None))
                if future is None or future.done():
                    continue
                if event.res < 0:
                    future.set_exception(OSError(-event.res, f"fdatasync: {os.strerror(-event.res)}"))
                else:
                    future.set_result(None)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Stop watching; io_destroy waits for what is in flight."""
        if self._eventfd < 0:
            return
        self._loop.remove_reader(self._eventfd)
        self._libc.syscall(ctypes.c_long(self._destroy), self._ctx)
        os.close(self._eventfd)
        self._eventfd = -1
        for future, _ in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()
