"""A real S3 endpoint on loopback, for the tests and the `--durability s3` benchmarks: moto's
server mode, behind a proxy that can be told to fail (connections refused or answered 503), the
way a bucket goes away for a while."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid

import boto3

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "agentos-test", "AWS_SECRET_ACCESS_KEY": "agentos-test",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultyProxy:
    """TCP proxy to the S3 server. mode: "up" forwards; "refuse" drops new connections;
    "503" answers every request with 503 Service Unavailable."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode = "up"
        self.stopping = False
        self.sockets: set[socket.socket] = set()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            if self.mode == "503":
                threading.Thread(target=self._fail, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _fail(self, client: socket.socket) -> None:
        try:
            client.settimeout(5)
            client.recv(65536)
            body = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            client.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.mode != "up":
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass
                self.sockets.discard(s)

    def set(self, mode: str) -> None:
        self.mode = mode
        if mode != "up":
            for s in list(self.sockets):  # cut the keep-alive connections too
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping = True
        self.listener.close()
        self.set("refuse")


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)
        self.proxy = FaultyProxy(self.port)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def client(self):
        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def new_bucket(self) -> str:
        name = f"agentos-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def storage_config(self, bucket: str, durability: str = "s3", direct: bool = False) -> dict:
        """Config keys for a node on `bucket`; `direct` bypasses the fault proxy (benchmarks)."""
        endpoint = f"http://127.0.0.1:{self.port}" if direct else self.endpoint
        return {"storage": {"durability": durability, "s3": {"bucket": bucket, "endpoint_url": endpoint,
                                                             "region": "us-east-1"}},
                "cluster": {"lease_renew_secs": 1.0, "lease_ttl_secs": 3.0}}

    def stop(self) -> None:
        self.proxy.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
