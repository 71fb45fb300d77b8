"""A log writer's direct inbox: `log.append` messages that skip the broker.

Every append and its ack used to cross the broker, two hops each way, and on two busy cores each
hop is a wake-up of another process (in this sandbox a zmq hop through the broker measured about
a millisecond under the checkpoint load). A writer therefore also binds a ROUTER beside the
broker's socket (`log-N.sock` in the run directory, so only with `broker.transport: ipc`), and
log clients connect a second bus client to it (storage/log_client.py). The envelopes are the
bus's own: the inbox takes the sender's name from its socket identity, as the broker does, and
answers with envelopes that name the writer as their source. Anything but `log.append` (the
client's hello and heartbeats, which go to the broker's name) is ignored. Over tcp, or for a
sender without an inbox connection, appends keep going through the broker.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import zmq

from broker import frames, protocol
from broker.protocol import Kind, Message, ProtocolError

_DRAIN_BATCH = 256


class LogInbox:
    def __init__(self, name: str, endpoint: str, on_append: Callable[[Message], None], log: logging.Logger) -> None:
        self.name = name
        self.endpoint = endpoint
        self.on_append = on_append
        self.log = log
        self.peers: dict[tuple[str, int], bytes] = {}    # (sender, message id) -> socket identity
        self.out: dict[bytes, list[bytes]] = {}
        self.sock: zmq.Socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poke: asyncio.TimerHandle | None = None
        self.received = 0
        self.malformed = 0

    def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 200_000)
        sock.setsockopt(zmq.RCVHWM, 200_000)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        sock.bind(self.endpoint)
        self.sock = sock
        self.loop.add_reader(sock.getsockopt(zmq.FD), self.drain)
        self._poke()

    def close(self) -> None:
        if self.poke is not None:
            self.poke.cancel()
        if self.sock is not None:
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
            self.sock.close(0)
            self.sock = None

    def _poke(self) -> None:
        # zmq's descriptor is edge-triggered and a send may consume the edge: drain now and then.
        self.drain()
        self.poke = self.loop.call_later(0.05, self._poke)

    def drain(self) -> None:
        sock = self.sock
        if sock is None:
            return
        for _ in range(_DRAIN_BATCH):
            try:
                identity, envelope = frames.router_recv(sock)
            except zmq.Again:
                return
            self._receive(identity, envelope)
        self.loop.call_soon(self.drain)

    def _receive(self, identity: bytes, envelope: bytes | None) -> None:
        if envelope is None or not protocol.IDENTITY.match(identity):
            self.malformed += 1
            return
        src = identity.partition(b"#")[0].decode()
        try:
            dest, offset = protocol.split_name(envelope)
            if dest.decode(errors="replace") != self.name:
                return                       # the client's hello and heartbeats
            kind = envelope[offset + 1:offset + 1 + envelope[offset]]
            if kind == protocol.BATCH_BYTES:
                inner = protocol.split_batch(protocol.split_rest(envelope, offset)[2])
                messages = [protocol.decode(one, src) for one in inner]
            else:
                messages = [protocol.decode(envelope, src)]
        except (ProtocolError, UnicodeDecodeError) as exc:
            self.malformed += 1
            if self.malformed <= 10:
                self.log.warning("dropped a malformed message from %s on the direct inbox: %s", src, exc)
            return
        for msg in messages:
            if msg.kind is Kind.LOG_APPEND:
                self.received += 1
                self.peers[(msg.src, msg.id)] = identity
                self.on_append(msg)

    def reply(self, msg: Message, kind: Kind, body: dict, msg_id: int) -> bool:
        """Answer `msg` here if it came in here; False if it came through the broker."""
        identity = self.peers.pop((msg.src, msg.id), None)
        if identity is None:
            return False
        envelope = protocol.encode(self.name, kind, body, id=msg_id, reply_to=msg.id, session=msg.session,
                                   turn=msg.turn)
        queued = self.out.get(identity)
        if queued is None:
            self.out[identity] = [envelope]
            if len(self.out) == 1:
                self.loop.call_soon(self._flush)
        else:
            queued.append(envelope)
        return True

    def _flush(self) -> None:
        """One frame per sender and loop iteration, a batch if several acks go to it."""
        out, self.out = self.out, {}
        for identity, envelopes in out.items():
            frame = envelopes[0] if len(envelopes) == 1 else protocol.encode_batch(self.name, envelopes)
            try:
                frames.router_send(self.sock, identity, frame)
            except zmq.ZMQError:
                pass   # the sender is gone or stuck: its attempt times out and it sends again
        self.drain()   # a send may have consumed the descriptor's edge: look for what came meanwhile
