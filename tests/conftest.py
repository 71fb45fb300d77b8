from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zygote  # noqa: E402
from harness import Server, Worker  # noqa: E402
from bench.s3_local import CREDENTIALS, S3Server  # noqa: E402
from broker.server import Broker  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def stop_the_zygote():
    """The test zygote (tests/zygote.py), if a test started one, goes with the test run."""
    yield
    zygote.close_shared()


@pytest.fixture(scope="module")
def flows_server(tmp_path_factory):
    """One tree and worker for a module's tests that kill nothing and need no config of their own
    (each tree's start is about a second of CPU, and the suite is CPU-bound)."""
    server = Server(tmp_path_factory.mktemp("flows")).start()
    worker = None
    try:
        worker = Worker(server, slots=32)
        worker.wait_registered()
        yield server
    finally:
        if worker is not None:
            worker.stop()
        server.stop()
    assert not server.leftovers(), f"processes left behind: {server.leftovers()}"


@pytest.fixture
def broker(tmp_path):
    """A broker on a thread of the test's process: (the Broker, its ipc endpoint). Its peers count
    as live for 10 s after they last spoke: with 1 s (the buses' heartbeat), a stall of this
    process under load took a live asker off the table, and it never heard its peer came back."""
    ctx = zmq.Context()
    b = Broker(f"ipc://{tmp_path}/b.sock", f"ipc://{tmp_path}/t.sock", peer_timeout_secs=10.0, context=ctx)
    stop = threading.Event()
    thread = threading.Thread(target=b.run, args=(stop.is_set,), daemon=True)
    thread.start()
    yield b, f"ipc://{tmp_path}/b.sock"
    stop.set()
    thread.join(5)
    b.close()
    ctx.term()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One real process tree for the tests that only send it traffic (they must not kill it)."""
    server = Server(tmp_path_factory.mktemp("shared"), {"kernel": {"concurrency_limit": 5}}).start()
    yield server
    server.stop()
    assert not server.leftovers(), f"processes left behind: {server.leftovers()}"


@pytest.fixture
def make_server(tmp_path):
    """A factory of private process trees, each stopped (and checked for leftovers) after the test."""
    servers: list[Server] = []

    def make(config: dict | None = None, env: dict | None = None, start: bool = True) -> Server:
        server = Server(tmp_path, config, env)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.stop()
    leftovers = [p for s in servers for p in s.leftovers()]
    assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture
def make_worker():
    """Workers (`agent-os worker flows_app`) stopped after the test, even on failure."""
    workers: list[Worker] = []

    def make(server, slots: int = 16, env: dict | None = None, args: tuple[str, ...] = ()) -> Worker:
        worker = Worker(server, slots, env, args=args)
        workers.append(worker)
        return worker.wait_registered()

    yield make
    for worker in workers:
        worker.stop()
    assert all(w.proc.poll() is not None for w in workers)


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server on loopback (behind a proxy that can fail on demand), for the whole run."""
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def make_s3_server(tmp_path, s3):
    """Process trees on a bucket: `make(bucket, name, config, start)`; each node gets its own data dir."""
    servers: list[Server] = []

    def make(bucket: str, name: str = "a", config: dict | None = None, start: bool = True,
             durability: str = "s3", args: tuple = ()) -> Server:
        from harness import deep_merge
        server = Server(tmp_path / name, deep_merge(s3.storage_config(bucket, durability), config or {}),
                        env=CREDENTIALS)
        server.args = args
        servers.append(server)
        return server.start() if start else server

    yield make
    s3.proxy.set("up")
    for server in servers:
        server.stop()
    leftovers = [p for s in servers for p in s.leftovers()]
    assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture(scope="session")
def postgres_installed():
    """PostgreSQL's server on this machine, installed from the system's packages as the benchmarks
    do when it is missing (a fresh machine); the test is skipped, saying why, where it cannot be."""
    from bench.peer_pgredis import StackError, ensure_installed

    try:
        return ensure_installed()
    except StackError as exc:
        pytest.skip(f"PostgreSQL is not installed and cannot be: {exc}")
