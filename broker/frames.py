"""Raw ZeroMQ frame I/O: the one place that touches sockets frame by frame.

pyzmq's convenience layer (send_multipart, recv_multipart, getsockopt) converts flags and
options through Python enums on every call, which costs ~20 µs per message here; these calls go
to the Cython backend with plain int flags and cost about 1 µs.
"""
from __future__ import annotations

import zmq
from zmq.backend import Socket as _Backend

from broker.codec import LARGE_ENVELOPE_BYTES

_send = _Backend.send
_recv = _Backend.recv
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
# From this size on a frame goes to ZeroMQ without a copy: it keeps a reference to the (immutable)
# bytes until sent (broker/codec.py says why the size).
ZERO_COPY_BYTES = LARGE_ENVELOPE_BYTES


def send(sock: zmq.Socket, envelope: bytes) -> None:
    """One envelope on a DEALER; raises zmq.Again at the high-water mark."""
    _send(sock, envelope, NOBLOCK, len(envelope) < ZERO_COPY_BYTES, False)


def recv(sock: zmq.Socket) -> bytes:
    """One envelope from a DEALER; raises zmq.Again when none is waiting."""
    return _recv(sock, NOBLOCK, True, False)


def router_send(sock: zmq.Socket, identity: bytes, envelope: bytes) -> None:
    """Raises zmq.Again at the high-water mark, ZMQError(EHOSTUNREACH) for an unknown peer."""
    _send(sock, identity, NOBLOCK_MORE, True, False)
    _send(sock, envelope, NOBLOCK, len(envelope) < ZERO_COPY_BYTES, False)


def router_recv(sock: zmq.Socket) -> tuple[bytes, bytes | None]:
    """(identity, envelope) from a ROUTER; envelope None if the peer sent more than one frame."""
    identity = _recv(sock, NOBLOCK, True, False)
    frame = _recv(sock, NOBLOCK, False, False)
    if not frame.more:
        return identity, frame.bytes
    while frame.more:  # a multipart message is not ours: consume all of it
        frame = _recv(sock, NOBLOCK, False, False)
    return identity, None
