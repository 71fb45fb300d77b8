"""The broker process: a ROUTER that forwards by destination name, never decoding bodies.

Owns the table of live peers (from their messages and heartbeats), answers an unknown or dead
destination with `ctl.undeliverable` to the sender, counts and drops malformed messages, and
publishes each routed header on the trace tap (an XPUB socket, only while someone listens).
It keeps no state that matters: if it dies, peers reconnect and re-send what was in flight.

The broker is a plain zmq poll loop rather than asyncio: it is the one process whose whole job
is moving frames, and draining the socket in a tight loop forwards ~30% more per core.
"""
from __future__ import annotations

import errno
import logging
import struct
import time
from typing import Callable

import msgpack
import zmq
import zmq.auth

from agentos import metrics
from zmq.auth.thread import ThreadAuthenticator

from broker import codec, frames, protocol
from broker.address import REMOTE_NAMES, TRACE_ZAP_DOMAIN, ZAP_DOMAIN, BusAddress
from broker.protocol import BROKER, KIND_BYTES, Kind, ProtocolError

log = logging.getLogger("agent-os.broker")

_BROKER_NAME = BROKER.encode()
_UNDELIVERABLE = KIND_BYTES[Kind.UNDELIVERABLE]
_UNDELIVERABLE_PREFIX = bytes([len(_UNDELIVERABLE)]) + _UNDELIVERABLE
_BROKER_PREFIX = codec.name_prefix(BROKER)
_U16 = struct.Struct("<H")
_QUIET_KINDS = {KIND_BYTES[Kind.HEARTBEAT], KIND_BYTES[Kind.HELLO]}
_MAX_KIND_LABELS = 128
_DRAIN_BATCH = 2000
_pack = msgpack.Packer(use_bin_type=True).pack


def _renamed(prefix: bytes, envelope: bytes, offset: int) -> bytes:
    """The envelope with the sender's name in place of the destination's. A big one in one copy
    (a slice and a concatenation would copy it twice: a quarter of the broker's CPU in reads of
    ten 16 KiB attributes)."""
    if len(envelope) < codec.LARGE_ENVELOPE_BYTES:
        return prefix + envelope[offset:]
    return b"".join((prefix, memoryview(envelope)[offset:]))


class _Keys:
    """Who gets in (ZeroMQ's authenticator asks for every connection): onto the bus, a key in the
    authorized directory (read at start, as `agent-os keys` left it); onto the trace tap, the node's
    own key only — it shows every tenant's sessions and turns as they route, which a remote worker
    has no business reading."""

    def __init__(self, authorized_dir: str, local_key: str) -> None:
        self.authorized = set(zmq.auth.load_certificates(authorized_dir))
        self.local = local_key.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        if domain == TRACE_ZAP_DOMAIN:
            return key == self.local
        return key in self.authorized


class Broker:
    def __init__(self, endpoint: "str | BusAddress", trace_endpoint: str = "", *, peer_timeout_secs: float = 3.0,
                 context: zmq.Context | None = None) -> None:
        self.peer_timeout = peer_timeout_secs
        self.ctx = context or zmq.Context.instance()
        self.auth = None
        address = endpoint if isinstance(endpoint, BusAddress) else BusAddress(endpoint, trace_endpoint, endpoint,
                                                                               trace_endpoint)
        # With CURVE: the key each identity first came with (broker/address.py REMOTE_NAMES)
        self.local_key: str | None = None
        self.key_of: dict[bytes, str | None] = {}
        if address.curve is not None:  # only peers whose public key is authorized get in
            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.local_key = address.curve.client_public.decode()
            keys = _Keys(address.curve.authorized_dir, self.local_key)
            for domain in (ZAP_DOMAIN, TRACE_ZAP_DOMAIN):
                self.auth.configure_curve_callback(domain, keys)
        self.router = self.ctx.socket(zmq.ROUTER)
        address.secure_server(self.router)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 200_000)
        self.router.setsockopt(zmq.RCVHWM, 200_000)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        self.router.bind(address.bind)
        self.tap = self.ctx.socket(zmq.XPUB)
        self.tap.setsockopt(zmq.SNDHWM, 10_000)
        self.tap.setsockopt(zmq.LINGER, 0)
        address.secure_server(self.tap, TRACE_ZAP_DOMAIN)
        self.tap.bind(address.trace_bind)
        self.tap_topics: dict[bytes, int] = {}
        self.identity_of: dict[bytes, bytes] = {}     # name -> identity of its latest incarnation
        self.name_of: dict[bytes, bytes] = {}         # identity -> name
        self.prefix_of: dict[bytes, bytes] = {}       # identity -> envelope prefix naming it as source
        self.last_seen: dict[bytes, float] = {}       # identity -> monotonic time
        self.info: dict[bytes, dict] = {}             # name -> {"role", "pid"} from hello/heartbeat
        self.kind_counts: dict[bytes, int] = {}
        self.undeliverable: dict[str, int] = {}
        self.malformed = 0
        self.reported = metrics.Totals()                # what _flush_metrics has added to the counters
        self.routed = 0
        self._logged_bad: set[bytes] = set()
        self.stopping = False

    # -- peers ---------------------------------------------------------------------------

    def _register(self, identity: bytes) -> bytes | None:
        if not protocol.IDENTITY.match(identity):
            return None
        name = identity.partition(b"#")[0]
        old = self.identity_of.get(name)
        if old is not None and old != identity:
            self.name_of.pop(old, None)
            self.prefix_of.pop(old, None)
            self.last_seen.pop(old, None)
            log.info("peer %s reconnected as a new incarnation", name.decode())
            self._announce_restart(name, identity)
        self.identity_of[name] = identity
        self.name_of[identity] = name
        self.prefix_of[identity] = codec.name_prefix(name)
        return name

    def route_keyed(self, identity: bytes, envelope: bytes | None, now: float, key: str | None) -> None:
        """route() on a CURVE bus: a peer connecting with a key other than the node's own may only
        take a remote peer's name, and an identity stays with the key it came with (one freed by a
        closed connection cannot be taken up by another key)."""
        known = self.key_of.get(identity)
        if known != key:
            if known is not None or (key != self.local_key and not identity.startswith(REMOTE_NAMES)):
                self._malformed(identity, f"a peer with the key {str(key)[:10]}… may not be named so")
                return
            if protocol.IDENTITY.match(identity):   # one route() refuses is not remembered
                self.key_of[identity] = key
        self.route(identity, envelope, now)

    def _announce_restart(self, name: bytes, new_identity: bytes) -> None:
        """Whatever was asked of the old incarnation died with it: its askers re-send now rather
        than after their attempt timeout (restarts are rare; the broadcast is cheap)."""
        envelope = codec.encode(BROKER, Kind.PEER_RESTARTED, {"name": name.decode()})
        now = time.monotonic()
        for identity, seen in self.last_seen.items():
            if identity != new_identity and now - seen <= self.peer_timeout:
                try:
                    frames.router_send(self.router, identity, envelope)
                except zmq.ZMQError:
                    pass

    def _live_identity(self, name: bytes, now: float) -> bytes | None:
        identity = self.identity_of.get(name)
        if identity is None or now - self.last_seen.get(identity, 0.0) > self.peer_timeout:
            return None
        return identity

    def _stalled(self, now: float) -> None:
        """The broker did not run for a while (stopped, starved): its peers' messages meanwhile
        wait unread, so their silence says nothing. Taken for dead, each would have had what was
        sent to it bounced until its next heartbeat was read."""
        for identity in self.last_seen:
            self.last_seen[identity] = now

    def _expire(self, now: float) -> None:
        for identity, seen in list(self.last_seen.items()):
            if now - seen > self.peer_timeout * 10:
                name = self.name_of.pop(identity, b"")
                self.prefix_of.pop(identity, None)
                self.last_seen.pop(identity, None)
                self.key_of.pop(identity, None)
                if self.identity_of.get(name) == identity:
                    del self.identity_of[name]
                    self.info.pop(name, None)

    # -- routing -------------------------------------------------------------------------

    def _malformed(self, identity: bytes, why: str) -> None:
        self.malformed += 1
        if identity not in self._logged_bad and len(self._logged_bad) < 1000:
            self._logged_bad.add(identity)
            log.warning("dropped malformed message from %r: %s", identity[:80], why)

    def _bounce(self, identity: bytes, dest: bytes, envelope: bytes, offset: int, reason: str) -> None:
        """Tell the sender its message was not delivered; the header (and so the id) is its own."""
        self.undeliverable[reason] = self.undeliverable.get(reason, 0) + 1
        try:
            kind, header, _ = codec.split_rest(envelope, offset)
        except ProtocolError:
            return
        if kind == _UNDELIVERABLE:
            return  # never bounce a bounce
        body = _pack({"dest": dest.decode(errors="replace"), "kind": kind.decode(errors="replace"),
                      "reason": reason})
        reply = b"".join((_BROKER_PREFIX, _UNDELIVERABLE_PREFIX, _U16.pack(len(header)), header, body))
        try:
            frames.router_send(self.router, identity, reply)
        except zmq.ZMQError:
            pass  # the sender is gone too or its queue is full; its request deadline covers it

    def route(self, identity: bytes, envelope: bytes | None, now: float) -> None:
        if envelope is None:
            self._malformed(identity, "multipart message")
            return
        name = self.name_of.get(identity) or self._register(identity)
        if name is None:
            self._malformed(identity, "peer identity is not NAME#INCARNATION")
            return
        try:
            dest, offset = codec.split_name(envelope)
        except ProtocolError as exc:
            self._malformed(identity, str(exc))
            return
        self.last_seen[identity] = now
        kind = envelope[offset + 1:offset + 1 + envelope[offset]]
        if kind == codec.BATCH_BYTES:
            inner = self._open_batch(identity, envelope, offset)
            if inner is None:
                return
        else:
            inner = None
            self._count(kind)
        if dest == _BROKER_NAME:
            for one, one_offset in inner or ((envelope, offset),):
                self._control(identity, name, one, one_offset)
            return
        target = self._live_identity(dest, now)
        reason = None
        if target is None:
            reason = "unknown" if dest not in self.identity_of else "dead"
        else:
            try:
                frames.router_send(self.router, target, _renamed(self.prefix_of[identity], envelope, offset))
            except zmq.Again:
                reason = "queue full"
            except zmq.ZMQError as exc:
                if exc.errno != errno.EHOSTUNREACH:
                    raise
                self.last_seen.pop(target, None)
                reason = "unreachable"
        if reason is not None:
            for one, one_offset in inner or ((envelope, offset),):
                self._bounce(identity, dest, one, one_offset, reason)
            return
        self.routed += 1
        if self.tap_topics:
            for one, one_offset in inner or ((envelope, offset),):
                if one[one_offset + 1:one_offset + 1 + one[one_offset]] not in _QUIET_KINDS:
                    self._publish(name, dest, one, one_offset)

    def _count(self, kind: bytes) -> None:
        counts = self.kind_counts
        if kind in counts:
            counts[kind] += 1
        elif len(counts) < _MAX_KIND_LABELS:
            counts[kind] = 1

    def _open_batch(self, identity: bytes, envelope: bytes, offset: int) -> list[tuple[bytes, int]] | None:
        """The envelopes of a batch with their kind offsets, counted by kind; None if malformed."""
        try:
            out = []
            for one in codec.split_batch(codec.split_rest(envelope, offset)[2]):
                _, one_offset = codec.split_name(one)
                self._count(one[one_offset + 1:one_offset + 1 + one[one_offset]])
                out.append((one, one_offset))
        except ProtocolError as exc:
            self._malformed(identity, f"bad batch: {exc}")
            return None
        return out

    def _publish(self, src: bytes, dest: bytes, envelope: bytes, offset: int) -> None:
        try:
            kind, header, _ = codec.split_rest(envelope, offset)
            frames.send(self.tap, codec.trace_record(kind, src, dest, header, time.time()))
        except (zmq.ZMQError, ProtocolError):
            pass  # a slow trace subscriber never slows routing

    def _control(self, identity: bytes, name: bytes, envelope: bytes, offset: int) -> None:
        try:
            kind_raw, header, body_raw = codec.split_rest(envelope, offset)
            kind = codec.decode_kind(kind_raw)
            msg_id, _, _, _, _ = codec.decode_header(header)
            body = codec.decode_body(kind, body_raw)
        except ProtocolError as exc:
            self._malformed(identity, str(exc))
            return
        if kind in (Kind.HELLO, Kind.HEARTBEAT):
            entry = self.info.setdefault(name, {})
            entry["pid"] = body["pid"]
            entry["role"] = body["role"]
            if kind == Kind.HELLO:
                entry["since"] = time.time()
            return
        if kind == Kind.PEERS:
            self._reply(identity, msg_id, Kind.PEERS_REPLY, {"peers": self.peer_table()})
        elif kind == Kind.STATS:
            self._reply(identity, msg_id, Kind.STATS_REPLY, {"role": "broker", "stats": self.stats()})
        else:
            self._malformed(identity, f"{kind} is not a broker command")

    def _reply(self, identity: bytes, reply_to: int, kind: Kind, body: dict) -> None:
        try:
            frames.router_send(self.router, identity, codec.encode(BROKER, kind, body, reply_to=reply_to))
        except zmq.ZMQError:
            pass

    def peer_table(self) -> dict[str, dict]:
        now = time.monotonic()
        table = {}
        for name, identity in self.identity_of.items():
            age = now - self.last_seen.get(identity, 0.0)
            table[name.decode()] = {"identity": identity.decode(), "age_secs": round(age, 3),
                                    "live": age <= self.peer_timeout, **self.info.get(name, {})}
        return table

    def stats(self) -> dict:
        return {"routed": self.routed, "malformed": self.malformed, "peers": len(self.identity_of),
                "undeliverable": dict(self.undeliverable), "trace_subscribers": len(self.tap_topics),
                "by_kind": {k.decode(errors="replace"): v for k, v in self.kind_counts.items()}}

    # -- trace tap -----------------------------------------------------------------------

    def _drain_tap(self) -> None:
        while True:
            try:
                event = self.tap.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not event:
                continue
            topic = event[1:]
            if event[0] == 1:
                self.tap_topics[topic] = self.tap_topics.get(topic, 0) + 1
            elif event[0] == 0 and topic in self.tap_topics:
                self.tap_topics[topic] -= 1
                if self.tap_topics[topic] <= 0:
                    del self.tap_topics[topic]

    # -- loop ----------------------------------------------------------------------------

    def _flush_metrics(self) -> None:
        for kind, count in self.kind_counts.items():
            self.reported.report(metrics.bus_messages.labels(kind.decode(errors="replace")), count)
        for reason, count in self.undeliverable.items():
            self.reported.report(metrics.bus_undeliverable.labels(reason), count)
        self.reported.report(metrics.bus_malformed.labels("broker"), self.malformed)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.tap, zmq.POLLIN)
        router = self.router
        recv = frames.router_recv
        keyed = self.local_key is not None
        next_housekeeping = time.monotonic() + 1.0
        last_wake = time.monotonic()
        while not (self.stopping or should_stop()):
            events = dict(poller.poll(200))
            woke = time.monotonic()
            if woke - last_wake > self.peer_timeout / 2:
                self._stalled(woke)
            last_wake = woke
            if self.router in events:
                now = time.monotonic()
                for _ in range(_DRAIN_BATCH):
                    try:
                        if keyed:
                            identity, envelope, key = frames.router_recv_keyed(router)
                        else:
                            identity, envelope = recv(router)
                    except zmq.Again:
                        break
                    try:
                        if keyed:
                            self.route_keyed(identity, envelope, now, key)
                        else:
                            self.route(identity, envelope, now)
                    except Exception:  # a bug must cost one message, never the broker
                        self.malformed += 1
                        log.exception("failed to route a message from %r", identity[:80])
            if self.tap in events:
                self._drain_tap()
            now = time.monotonic()
            if now >= next_housekeeping:
                next_housekeeping = now + 1.0
                self._expire(now)
                self._flush_metrics()
        self._flush_metrics()

    def close(self) -> None:
        self.router.close(0)
        self.tap.close(0)
        if self.auth is not None:
            self.auth.stop()
