"""Raw ZeroMQ frame I/O: the one place that touches sockets frame by frame.

pyzmq's convenience layer (send_multipart, recv_multipart, getsockopt) converts flags and
options through Python enums on every call, which costs ~20 µs per message here; these calls go
to the Cython backend with plain int flags and cost about 1 µs. Frames are copied into ZeroMQ,
even big ones: its zero-copy sends (a reference held until a garbage-collector thread hears the
frame went) did a little worse for replies of 160 KiB, side by side, and cost a thread per
process (bench/results/2026-12-04-big-envelopes-zero-copy-ab/).
"""
from __future__ import annotations

import zmq
from zmq.backend import Socket as _Backend

_send = _Backend.send
_recv = _Backend.recv
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


def send(sock: zmq.Socket, envelope: bytes) -> None:
    """One envelope on a DEALER; raises zmq.Again at the high-water mark."""
    _send(sock, envelope, NOBLOCK, True, False)


def recv(sock: zmq.Socket) -> bytes:
    """One envelope from a DEALER; raises zmq.Again when none is waiting."""
    return _recv(sock, NOBLOCK, True, False)


def router_send(sock: zmq.Socket, identity: bytes, envelope: bytes) -> None:
    """Raises zmq.Again at the high-water mark, ZMQError(EHOSTUNREACH) for an unknown peer."""
    _send(sock, identity, NOBLOCK_MORE, True, False)
    _send(sock, envelope, NOBLOCK, True, False)


def router_recv(sock: zmq.Socket) -> tuple[bytes, bytes | None]:
    """(identity, envelope) from a ROUTER; envelope None if the peer sent more than one frame."""
    identity = _recv(sock, NOBLOCK, True, False)
    frame = _recv(sock, NOBLOCK, False, False)
    if not frame.more:
        return identity, frame.bytes
    while frame.more:  # a multipart message is not ours: consume all of it
        frame = _recv(sock, NOBLOCK, False, False)
    return identity, None


def router_recv_keyed(sock: zmq.Socket) -> tuple[bytes, bytes | None, str | None]:
    """router_recv, and the CURVE key its peer connected with (z85, as the authenticator names it)."""
    identity = _recv(sock, NOBLOCK, True, False)
    frame = _recv(sock, NOBLOCK, False, False)
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:    # a connection the authenticator named no user for
        user = None
    if not frame.more:
        return identity, frame.bytes, user
    while frame.more:
        frame = _recv(sock, NOBLOCK, False, False)
    return identity, None, user
