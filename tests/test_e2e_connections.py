"""End-to-end: the gateway holds more client connections than the soft limit on open files it
was started with (most systems give a service 1024; the server lifts it to the hard limit)."""
import resource
import socket
from urllib.parse import urlsplit

import pytest

CONNECTIONS = 400
STARTED_WITH = 256


def test_more_connections_than_the_soft_open_files_limit_it_started_with(make_server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2 * CONNECTIONS + 100:
        pytest.skip(f"the hard limit on open files here is {hard}")
    server = make_server(start=False)
    resource.setrlimit(resource.RLIMIT_NOFILE, (STARTED_WITH, hard))   # what the server inherits
    try:
        server.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    url = urlsplit(server.url)
    socks = []
    try:
        for _ in range(CONNECTIONS):
            sock = socket.create_connection((url.hostname, url.port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")   # keep-alive: each stays open
            socks.append(sock)
        answered = 0
        for sock in socks:
            if sock.recv(4096).startswith(b"HTTP/1.1 200"):
                answered += 1
        assert answered == CONNECTIONS
    finally:
        for sock in socks:
            sock.close()
