"""Readiness: which of the peers the gateway needs the broker has not heard from lately.

The broker answers with a map keyed by peer name, and msgpack interns every map key it decodes.
CPython's table of interned strings never shrinks: a name that is decoded, interned and freed
again leaves a used slot behind, and a name like "writer/log/0" (no identifier) has no interned
constant in the code to reuse. Asked once a second, the ~6 such names filled the gateway's table
in about half an hour, which then doubled: ~1 MB kept for good, the late step of the memory soak.
Holding the last answer keeps its names interned, so the next answer's names are those same
objects and nothing is added.
"""
from __future__ import annotations

from broker.client import Bus, BusError
from broker.protocol import BROKER, Kind


class PeerWatch:
    def __init__(self, bus: Bus, expected: list[str]) -> None:
        self.bus = bus
        self.expected = expected
        self.peers: dict[str, dict] = {}     # the broker's last answer (see above for why it is kept)
        self.missing: list[str] = ["(not checked yet)"]

    async def check(self) -> None:
        try:
            reply = await self.bus.request(BROKER, Kind.PEERS, {}, timeout=1.0, attempt_secs=0.5)
        except BusError:
            self.missing = ["broker"]
            return
        self.peers = reply.body["peers"]
        self.missing = [name for name in self.expected if not self.peers.get(name, {}).get("live")]
