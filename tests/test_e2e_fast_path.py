"""End-to-end: the gateway's lean path for the checkpoint routes (gateway/fast_path.py) speaks
HTTP/1.1 like aiohttp does — pipelined, split, half-closed and mixed-route connections, and
unusual or broken requests handed to aiohttp on the same connection."""
import os
import random
import socket
import time
import urllib.request
from urllib.parse import urlsplit

from harness import cpu_seconds, get_json, scrape, wait_until


def connect(server) -> socket.socket:
    url = urlsplit(server.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def put_request(sid: str, key: str, payload: bytes, extra: str = "") -> bytes:
    return (f"PUT /v1/sessions/{sid}/checkpoints/{key} HTTP/1.1\r\nHost: t\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


def get_request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


class Responses:
    """Reads whole HTTP/1.1 responses (Content-Length bodies) off one connection, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def next(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split(" ")[1]), headers, body

    def closed(self) -> bool:
        try:
            return self.buf == b"" and self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def test_pipelined_requests_are_answered_in_order(shared_server):
    a, b = os.urandom(3000), os.urandom(70_000)
    with connect(shared_server) as sock:
        sock.sendall(put_request("fp-pipe", "k1", a) + put_request("fp-pipe", "k2", b)
                     + get_request("/v1/sessions/fp-pipe/checkpoints/latest"))
        responses = Responses(sock)
        first, second, latest = responses.next(), responses.next(), responses.next()
    assert first[0] == second[0] == 200
    assert [first[2].count(b'"k1"'), second[2].count(b'"k2"')] == [1, 1]
    assert latest[0] == 200 and latest[2] == b and latest[1]["x-checkpoint-key"] == "k2"


def test_a_request_in_small_pieces_and_a_half_closed_connection(shared_server):
    import time
    payload = os.urandom(20_000)
    data = put_request("fp-split", "k", payload)
    with connect(shared_server) as sock:
        for i in range(0, len(data), 4000):
            if i:
                time.sleep(0.01)
            sock.sendall(data[i:i + 4000])
        # At once, while the PUT is still being made durable: the GET and the half-close must
        # wait for it, not cut the connection after it.
        sock.sendall(get_request("/v1/sessions/fp-split/checkpoints/latest"))
        sock.shutdown(socket.SHUT_WR)
        responses = Responses(sock)
        assert responses.next()[0] == 200
        status, _, body = responses.next()
        assert (status, body) == (200, payload)
        assert responses.closed()


def test_other_routes_on_the_same_connection_go_to_aiohttp(shared_server):
    with connect(shared_server) as sock:
        responses = Responses(sock)
        sock.sendall(put_request("fp-mixed", "k", b"one"))
        status, fast_headers, _ = responses.next()
        assert status == 200
        sock.sendall(get_request("/healthz"))
        status, aiohttp_headers, body = responses.next()
        assert (status, body) == (200, b'{"ok":true}')
        assert fast_headers["server"] != aiohttp_headers["server"]   # the connection changed hands
        sock.sendall(put_request("fp-mixed", "k2", b"two") + get_request("/v1/sessions/fp-mixed/checkpoints/latest"))
        assert responses.next()[0] == 200
        status, headers, body = responses.next()
        assert (status, body, headers["x-checkpoint-key"]) == (200, b"two", "k2")


def test_chunked_escaped_and_oversized_requests_get_aiohttp_answers(shared_server):
    with connect(shared_server) as sock:
        responses = Responses(sock)
        sock.sendall(b"PUT /v1/sessions/fp-odd/checkpoints/c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nchunk\r\n3\r\ned!\r\n0\r\n\r\n")
        assert responses.next()[0] == 200
    with urllib.request.urlopen(f"{shared_server.url}/v1/sessions/fp-odd/checkpoints/latest", timeout=10) as resp:
        assert resp.read() == b"chunked!"
    status, _, body = get_json(f"{shared_server.url}/v1/sessions/fp-odd/checkpoints/a%20b", method="PUT", body=b"x")
    assert (status, body["error"]["code"]) == (400, "invalid_key")
    with connect(shared_server) as sock:
        sock.sendall(b"PUT /v1/sessions/fp-odd/checkpoints/big HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n")
        status, _, body = Responses(sock).next()
        assert status == 413 and b"checkpoint_too_large" in body


def test_errors_have_the_json_shape_and_garbage_breaks_nothing(shared_server):
    status, _, body = get_json(f"{shared_server.url}/v1/sessions/-bad/checkpoints/k", method="PUT", body=b"x")
    assert (status, body["error"]["code"]) == (400, "invalid_session_id")
    status, _, body = get_json(f"{shared_server.url}/v1/sessions/fp-none/checkpoints/latest")
    assert (status, body["error"]["code"]) == (404, "not_found")
    for garbage in (os.urandom(300), b"PUT /v1/sessions/x/checkpoints/k HTTP/1.1\r\nbad header line\r\n\r\n",
                    b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 20_000 + b"\r\n\r\n"):
        with connect(shared_server) as sock:
            sock.sendall(garbage)
            try:
                status, _, _ = Responses(sock).next()
                assert 400 <= status < 500
            except ConnectionError:
                pass   # closed without an answer: also fine, as long as the server goes on
    assert get_json(f"{shared_server.url}/v1/sessions/fp-after/checkpoints/k", method="PUT", body=b"ok")[0] == 200


def test_heads_aiohttp_would_refuse_are_refused_not_served(shared_server):
    """A header name that is not a token, a control character, a lone CR or LF, no Host: aiohttp
    answers 400 to each; the fast path hands them to it instead of storing the checkpoint anyway."""
    for extra in ("Ho st: x\r\n", "X{: 1\r\n", "X: \x01\r\n", "X: a\x7fb\r\n", "X: a\rb\r\n"):
        with connect(shared_server) as sock:
            sock.sendall(put_request("fp-strict", "k", b"nope", extra))
            assert Responses(sock).next()[0] == 400, extra
        with connect(shared_server) as sock:
            sock.sendall(f"GET /v1/sessions/fp-strict/checkpoints/latest HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode())
            assert Responses(sock).next()[0] == 400, extra
    with connect(shared_server) as sock:    # no Host: an HTTP/1.1 request must have one
        sock.sendall(b"PUT /v1/sessions/fp-strict/checkpoints/k HTTP/1.1\r\nContent-Length: 4\r\n\r\nnope")
        assert Responses(sock).next()[0] == 400
    assert get_json(f"{shared_server.url}/v1/sessions/fp-strict/checkpoints/latest")[0] == 404   # none stored
    with connect(shared_server) as sock:    # a tab inside a value is allowed, as aiohttp allows it
        sock.sendall(put_request("fp-strict", "k", b"yes", "X-Note: a\tb\r\n"))
        assert Responses(sock).next()[0] == 200


def test_fast_path_requests_are_counted_like_the_others(shared_server):
    route = 'route="/v1/sessions/{sid}/checkpoints/{key}",status="200"'
    before = scrape(shared_server.url).get(f"agentos_http_requests_total{{{route}}}", 0.0)
    for i in range(3):
        assert get_json(f"{shared_server.url}/v1/sessions/fp-count/checkpoints/k{i}", method="PUT", body=b"x")[0] == 200
    wait_until(lambda: scrape(shared_server.url).get(f"agentos_http_requests_total{{{route}}}", 0.0) >= before + 3,
               10, "the fast path's requests to be counted")   # metrics are flushed about once a second


def test_with_the_fast_path_off_aiohttp_serves_the_checkpoint_routes(make_server, shared_server):
    server = make_server({"gateway": {"fast_checkpoints": False}})
    with connect(server) as sock:
        sock.sendall(put_request("fp-off", "k", b"plain") + get_request("/v1/sessions/fp-off/checkpoints/latest"))
        responses = Responses(sock)
        status, headers, _ = responses.next()
        assert status == 200 and "aiohttp" in headers["server"]
        assert responses.next()[2] == b"plain"
    # and the fast path answers what aiohttp answers: the same broken heads to both, the same status
    rng = random.Random(20261202)
    requests = [put_request("fp-fuzz", "k", b"hello", "Content-Type: application/octet-stream\r\n"),
                b"GET /v1/sessions/fp-fuzz/checkpoints/latest HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer x\r\n\r\n"]
    differ = []
    for _ in range(300):
        raw = _break_head(rng, rng.choice(requests))
        fast, plain = _first_status(shared_server, raw), _first_status(server, raw)
        if fast != plain:   # once more, longer: a slow fdatasync on a busy machine is not "no answer"
            fast, plain = _first_status(shared_server, raw, 10.0), _first_status(server, raw, 10.0)
        if fast != plain:
            differ.append((raw, fast, plain))
    assert not differ, differ[:5]


def _break_head(rng: random.Random, request: bytes) -> bytes:
    """A request with one to three bytes of its head changed, dropped or added."""
    raw = bytearray(request)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(max(1, raw.find(b"\r\n\r\n")))
        op = rng.random()
        if op < 0.3:
            raw[at] = rng.randrange(256)
        elif op < 0.45:
            raw[at] = rng.randrange(32, 127)
        elif op < 0.6:
            raw[at:at] = bytes([rng.randrange(256)])
        elif op < 0.8:
            del raw[at]
        else:
            raw[at:at] = rng.choice([b"\r\n", b"\n", b" ", b":", b"\t", b"\r", b",", b"%20", b"?"])
    return bytes(raw)


def _first_status(server, raw: bytes, timeout: float = 1.0) -> str:
    """The status of the first answer to `raw`, or how the connection ended without one."""
    with connect(server) as sock:
        sock.settimeout(timeout)
        sock.sendall(raw)
        try:
            return str(Responses(sock).next()[0])
        except ConnectionError:
            return "closed"
        except TimeoutError:
            return "no answer"


def test_malformed_requests_are_counted_and_logged_without_a_traceback_each(shared_server):
    """aiohttp alone logged each one at ERROR with a traceback: any client could flood the log."""
    key = 'agentos_http_requests_total{route="malformed",status="400"}'
    before_count = scrape(shared_server.url).get(key, 0.0)
    before_log = shared_server.log_path.read_bytes()
    malformed = (b"PUT /v1/sessions/m/checkpoints/k HTTP/1.1\r\nHost: t\r\nno colon here\r\nContent-Length: 1\r\n\r\nx",
                 b"PUT /v1/sessions/m/checkpoints/k HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
                 b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n")
    for i in range(30):
        with connect(shared_server) as sock:
            sock.sendall(malformed[i % 3])
            status, headers, _ = Responses(sock).next()
            assert status == 400
    wait_until(lambda: scrape(shared_server.url).get(key, 0.0) >= before_count + 30, 10,
               "the malformed requests to be counted")
    added = shared_server.log_path.read_bytes()[len(before_log):]
    assert b"Traceback" not in added
    assert added.count(b"malformed HTTP request answered 400") <= 1   # one line a minute at most
    assert get_json(f"{shared_server.url}/v1/sessions/fp-after-malformed/checkpoints/k", method="PUT", body=b"ok")[0] == 200


def test_a_head_ended_by_bare_line_feeds_is_refused_at_once(shared_server):
    """The lean path waited for CRLF CRLF that never came: the client hung until the idle timeout."""
    with connect(shared_server) as sock:
        sock.settimeout(5)
        sock.sendall(b"PUT /v1/sessions/lf/checkpoints/k HTTP/1.1\nHost: t\nContent-Length: 1\n\nx")
        assert Responses(sock).next()[0] == 400


def test_after_answering_the_gateway_polls_briefly_then_sleeps(shared_server):
    """gateway.poll_after_answer_usecs (150 µs) keeps the loop awake after each answer, not
    for good: a gateway sent requests one after another, then nothing, goes quiet."""
    gateway = shared_server.pid("gateway/0")
    with connect(shared_server) as sock:
        reader = Responses(sock)
        for n in range(200):
            sock.sendall(put_request("poll-then-sleep", "k", b"x" * 100) if n % 2 else
                         get_request("/v1/sessions/poll-then-sleep/checkpoints/latest"))
            assert reader.next()[0] in (200, 404)
    # A loop left polling would take each whole second; an idle one may still do the odd piece of
    # background work (access rows, the metrics' flush) in one of them.
    idle = []
    while len(idle) < 3 and not (idle and idle[-1] < 0.2):
        before = cpu_seconds(gateway)
        time.sleep(1.0)
        idle.append(cpu_seconds(gateway) - before)
    assert min(idle) < 0.2, idle
