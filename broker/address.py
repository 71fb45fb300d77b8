"""Where the bus is and how to reach it.

`broker.transport: ipc` (the default): sockets in the run directory, which only the server's user
can enter. `broker.transport: tcp`: the broker listens on `broker.listen` (and the trace tap on
`broker.trace_listen`) with ZeroMQ CURVE — every connection is encrypted, and a peer whose public
key is not in `<keys>/authorized/` is refused. `agent-os keys` makes the key pairs. The node's own
processes connect with its `client` key; any other authorized key (a remote worker's,
`broker.client_key`) may only take the names in REMOTE_NAMES (the broker checks every message).
The trace tap lets in the node's own key only: it shows every tenant's sessions and turns.
"""
from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from agentos.config import Config, ConfigError
from agentos.rundir import RunDir

ZAP_DOMAIN = "agent-os"
TRACE_ZAP_DOMAIN = "agent-os-trace"
LOCAL_KEY = "client"     # the key pair the node's own processes connect with
# What a peer connecting with another authorized key may be named: a worker, or a command-line
# tool asking for stats. Not a role whose messages others take on its name's word (a drain, a
# lease, a log's end: broker/protocol.py SENDERS), nor an actor or a log writer.
REMOTE_NAMES = (b"worker/", b"cli/")


@dataclass(frozen=True)
class Curve:
    server_public: bytes
    server_secret: bytes | None     # only the broker has it
    client_public: bytes
    client_secret: bytes
    authorized_dir: str


@dataclass(frozen=True)
class BusAddress:
    endpoint: str          # where peers connect
    trace: str             # where trace subscribers connect
    bind: str              # where the broker binds the bus
    trace_bind: str
    curve: Curve | None = None

    def secure_client(self, sock: zmq.Socket) -> None:
        if self.curve is not None:
            sock.curve_secretkey = self.curve.client_secret
            sock.curve_publickey = self.curve.client_public
            sock.curve_serverkey = self.curve.server_public

    def secure_server(self, sock: zmq.Socket, domain: str = ZAP_DOMAIN) -> None:
        if self.curve is not None:
            sock.zap_domain = domain.encode()
            sock.curve_secretkey = self.curve.server_secret
            sock.curve_publickey = self.curve.server_public
            sock.curve_server = True

    def ready(self) -> bool:
        """The broker is there: its ipc socket exists, or its tcp port accepts connections."""
        if not self.endpoint:
            return False
        if self.endpoint.startswith("ipc://"):
            return Path(self.endpoint[6:]).exists()
        host, _, port = self.endpoint[6:].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            return True
        except OSError:
            return False


def direct_log_endpoint(bus_endpoint: "str | BusAddress", index: int) -> str | None:
    """Where log writer `index` takes appends straight from its senders, beside the broker's
    socket in the run directory; None over tcp (there every message goes through the broker)."""
    endpoint = bus_endpoint.endpoint if isinstance(bus_endpoint, BusAddress) else bus_endpoint
    if not endpoint.startswith("ipc://"):
        return None
    return f"{endpoint.rpartition('/')[0]}/log-{index}.sock"


def keys_dir(config: Config) -> Path:
    return Path(config.broker.keys_dir or Path(config.storage.dir) / "keys")


def bus_address(config: Config, run_dir: RunDir) -> BusAddress:
    if config.broker.transport == "ipc":
        return BusAddress(run_dir.bus_endpoint, run_dir.trace_endpoint, run_dir.bus_endpoint, run_dir.trace_endpoint)
    keys = keys_dir(config)
    client = config.broker.client_key or LOCAL_KEY
    try:
        server_public, server_secret = zmq.auth.load_certificate(keys / "server.key_secret")
        client_public, client_secret = zmq.auth.load_certificate(keys / f"{client}.key_secret")
    except (OSError, ValueError):
        try:  # a remote peer has the server's public key only
            server_public, _ = zmq.auth.load_certificate(keys / "server.key")
            client_public, client_secret = zmq.auth.load_certificate(keys / f"{client}.key_secret")
            server_secret = None
        except (OSError, ValueError):
            raise ConfigError(f"broker.transport tcp needs CURVE keys in {keys} (server.key and "
                              f"{client}.key_secret): run `agent-os keys`") from None
    curve = Curve(server_public, server_secret, client_public, client_secret, str(keys / "authorized"))
    bus, bus_bind = _tcp(config.broker.listen, run_dir, "bus")
    trace, trace_bind = _tcp(config.broker.trace_listen, run_dir, "trace")
    return BusAddress(bus, trace, bus_bind, trace_bind, curve)


def _tcp(listen: str, run_dir: RunDir, what: str) -> tuple[str, str]:
    """(connect, bind) endpoints; port 0: the broker picks one and writes it to the run directory,
    and binds it again after a restart."""
    host, _, port = listen.rpartition(":")
    if port != "0":
        return f"tcp://{listen}", f"tcp://{listen}"
    chosen = run_dir.read_port(f"broker-{what}")
    if chosen:
        return f"tcp://{host}:{chosen}", f"tcp://{host}:{chosen}"
    return "", f"tcp://{host}:*"


def publish_ports(router: zmq.Socket, tap: zmq.Socket, run_dir: RunDir) -> None:
    """After binding: where the broker really listens, for the peers that connect."""
    from agentos.rundir import write_port_file
    for what, sock in (("bus", router), ("trace", tap)):
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if endpoint.startswith("tcp://"):
            write_port_file(run_dir.port_file(f"broker-{what}"), int(endpoint.rsplit(":", 1)[1]))


def make_keys(directory: Path, clients: list[str]) -> list[Path]:
    """The broker's key pair (if missing) and one per client name, each client authorized."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    authorized = directory / "authorized"
    authorized.mkdir(exist_ok=True, mode=0o700)
    made = []
    if not (directory / "server.key_secret").exists():
        made += [Path(p) for p in zmq.auth.create_certificates(directory, "server")]
    for name in clients:
        if not (directory / f"{name}.key_secret").exists():
            made += [Path(p) for p in zmq.auth.create_certificates(directory, name)]
        shutil.copy(directory / f"{name}.key", authorized / f"{name}.key")
    for path in directory.glob("*.key_secret"):
        path.chmod(0o600)
    return made
