"""The broker's rule on a CURVE bus (broker/server.py `route_keyed`): a key other than the node's
own takes only a remote peer's name, and an identity keeps the key it first came with. The keys
are given as ZeroMQ's User-Id would name them; the tcp end to end is in test_e2e_bus_security.py."""
import zmq

from broker import codec
from broker.protocol import Kind
from broker.server import Broker


def test_a_remote_key_takes_only_remote_names_and_an_identity_keeps_its_key(tmp_path):
    ctx = zmq.Context()
    broker = Broker(f"ipc://{tmp_path}/bus.sock", f"ipc://{tmp_path}/trace.sock", context=ctx)
    broker.local_key = "LOCAL"
    to_nobody = codec.encode("nobody/0", Kind.PEERS, {}, id=1)    # routed: bounced as unknown

    def send(identity: bytes, key: str) -> str:
        malformed, bounced = broker.malformed, sum(broker.undeliverable.values())
        broker.route_keyed(identity, to_nobody, 0.0, key)
        return ("refused" if broker.malformed > malformed else
                "routed" if sum(broker.undeliverable.values()) > bounced else "?")

    try:
        assert send(b"supervisor#1", "LOCAL") == "routed"
        assert send(b"supervisor#2", "REMOTE") == "refused"       # a remote key posing as a role
        assert send(b"writer/log/0#7", "REMOTE") == "refused"
        assert send(b"worker/elsewhere-1#1", "REMOTE") == "routed"
        assert send(b"cli/42#1", "REMOTE") == "routed"
        assert send(b"supervisor#1", "REMOTE") == "refused"       # the node's identity, another key
        assert send(b"worker/elsewhere-1#1", "LOCAL") == "refused"  # an identity keeps its first key
        assert send(b"supervisor#1", "LOCAL") == "routed"
    finally:
        broker.close()
        ctx.term()
