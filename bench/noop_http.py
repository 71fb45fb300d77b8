"""A checkpoint server that does no work: the floor of an HTTP exchange for the checkpoint benchmark.

Owns: a process that answers the two checkpoint routes the way Agent OS does on the wire — `PUT
/v1/sessions/{sid}/checkpoints/{key}` with 200 and the JSON ack (`durability: "none"`), `GET
…/checkpoints/latest` with the newest body and its key headers (404 if none) — over keep-alive
HTTP/1.1, keeping only the newest body per session in a dict. Run as the `noop-http` target of
`agent-os bench checkpoints`, it measures what the benchmark's client, the loopback socket and
the request/response cost on this machine without any server work, so a report can say how much
of a commit is the server's. Never does: any other route, or any HTTP it does not need (no
chunked bodies, no Expect, no validation beyond finding the route).

With `--log-dir DIR` (the `fsync-http` target) it is the floor of a durable checkpoint server in
one Python process: each PUT body goes into a pre-zeroed scratch file, everything that arrived
while the previous fdatasync ran is written and fdatasync'd once (group commit, as writer/log
does), and only then are those PUTs answered (`durability: "local"`). No framing, no recovery,
no reading back: the file wraps around. It bounds what any single-process design could reach
here, so a report can say how much of a commit is our process split rather than Python + disk.

    python -m bench.noop_http [--port 0] [--log-dir DIR]   # prints "listening on http://127.0.0.1:PORT"
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys

import orjson

MAX_HEAD_BYTES = 8192
LATEST: dict[bytes, tuple[str, bytes]] = {}   # session -> (key, body) of its newest PUT
_seq = itertools.count(1)
LOG_BYTES = 256 << 20


class GroupCommit:
    """Answers held until the fdatasync that covers their bodies (see the module doc)."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "fsync-http.log")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        zeros = bytes(8 << 20)
        for at in range(0, LOG_BYTES, len(zeros)):   # pre-zeroed: fdatasync flushes data, not metadata
            os.pwrite(self.fd, zeros, at)
        os.fsync(self.fd)
        self.at = 0
        self.bodies: list[bytes] = []
        self.held: list[tuple["NoopConnection", bytes]] = []
        self.scheduled = False

    def hold(self, conn: "NoopConnection", body: bytes | None, answer: bytes) -> None:
        if body is not None:
            self.bodies.append(body)
        self.held.append((conn, answer))
        conn.held += 1
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.commit)

    def commit(self) -> None:
        self.scheduled = False
        data, self.bodies = b"".join(self.bodies), []
        held, self.held = self.held, []
        if self.at + len(data) > LOG_BYTES:
            self.at = 0
        os.pwrite(self.fd, data, self.at)
        os.fdatasync(self.fd)
        self.at += len(data)
        for conn, answer in held:
            conn.held -= 1
            if conn.transport is not None:
                conn.transport.write(answer)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


GROUP: GroupCommit | None = None


class NoopConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1          # body bytes the current request still has; -1: reading a head
        self.put: tuple[bytes, str] | None = None   # (session, key) of a PUT whose body is coming
        self.answer = b""
        self.held = 0           # answers of this connection waiting for a group commit

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None:
            if self.need < 0 and not self._head():
                return
            if len(self.buf) < self.need:
                return
            body = None
            if self.put is not None:
                body = bytes(self.buf[:self.need])
                LATEST[self.put[0]] = (self.put[1], body)
            del self.buf[:self.need]
            self.need = -1
            if GROUP is not None and (body is not None or self.held):
                GROUP.hold(self, body, self.answer)   # answered after the fdatasync, in order
            else:
                self.transport.write(self.answer)

    def _head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                self._reply_and_close(431, b'{"error":"head too large"}')
            return False
        lines = bytes(self.buf[:end]).split(b"\r\n")
        del self.buf[:end + 4]
        parts = lines[0].split(b" ")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value)
        route = parts[1].split(b"/") if len(parts) == 3 else []
        if len(route) != 6 or route[1:3] != [b"v1", b"sessions"] or route[4] != b"checkpoints":
            self._reply_and_close(404, b'{"error":{"code":"not_found","message":"not a checkpoint route"}}')
            return False
        session, key = route[3], route[5].decode("latin-1")
        self.put = None
        if parts[0] == b"PUT":
            self.put = (session, key)
            self.answer = _response(200, orjson.dumps({"key": key, "seq": next(_seq),
                                                     "durability": "none" if GROUP is None else "local"}))
        elif session in LATEST:
            latest_key, body = LATEST[session]
            self.answer = _response(200, body, b"application/octet-stream",
                                    b"X-Checkpoint-Key: %s\r\n" % latest_key.encode("latin-1"))
        else:
            self.answer = _response(404, b'{"error":{"code":"not_found","message":"no checkpoint"}}')
        self.need = length
        return True

    def _reply_and_close(self, status: int, body: bytes) -> None:
        self.transport.write(_response(status, body))
        self.transport.close()
        self.transport = None


def _response(status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> bytes:
    phrase = {200: b"OK", 404: b"Not Found", 431: b"Request Header Fields Too Large"}[status]
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, phrase, content_type, len(body), extra)) + body


async def serve(host: str, port: int, log_dir: str = "") -> None:
    global GROUP
    if log_dir:
        GROUP = GroupCommit(log_dir)
    server = await asyncio.get_running_loop().create_server(NoopConnection, host, port)
    print(f"listening on http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        if GROUP is not None:
            GROUP.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_http", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log-dir", default="", help="durable: group-commit PUT bodies to a scratch file here")
    args = parser.parse_args(argv)
    import uvloop   # the same loop as the gateway's

    try:
        uvloop.run(serve(args.host, args.port, args.log_dir))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
