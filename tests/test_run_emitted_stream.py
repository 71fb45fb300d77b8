"""A followed stream of a run's emitted values (gateway/run_emitted.py) when its run's actor stops
answering, and when its reader goes away, with a fake client and response."""
import asyncio

from actors.flow_client import FlowError
from gateway import run_emitted


class Response:
    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.body = b""
        self.ended = False

    async def prepare(self, request) -> None:
        pass

    async def write(self, data: bytes) -> None:
        if self.gone:
            raise ConnectionResetError("Cannot write to closing transport")
        self.body += data

    async def write_eof(self, data: bytes = b"") -> None:
        await self.write(data)
        self.ended = True


class Client:
    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.asked: list[tuple[int, float]] = []

    async def emitted(self, run_id, after, limit, wait, tenant=None):
        self.asked.append((after, wait))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def get(self, run_id, tenant=None):
        return {"run_id": run_id, "status": "completed", "result": "done", "flow": "f"}


class Routes:
    def __init__(self, client: Client) -> None:
        self.client = client


def follow(monkeypatch, answers: list, gone: bool = False) -> tuple[Response, Client]:
    response, client = Response(gone), Client(answers[1:])
    monkeypatch.setattr(run_emitted, "sse_response", lambda: response)
    asyncio.run(run_emitted._follow(Routes(client), None, "r-1", "t", -1, answers[0]))   # (no exception)
    return response, client


def op(seq: int, value) -> dict:
    return {"seq": seq, "op": "emit", "result": value, "ended_at": 1.0}


def test_the_stream_goes_on_after_each_value_and_ends_with_the_runs_end(monkeypatch):
    response, client = follow(monkeypatch, [([op(2, "a")], 3, "running"), ([op(3, "b")], None, "running"),
                                            ([], None, "completed")])
    assert response.body.count(b"event: emitted") == 2 and response.ended
    assert response.body.endswith(b'event: run.ended\ndata: {"status":"completed","result":"done"}\n\n')
    # more than a page: the next at once; then a wait for the next value
    assert client.asked == [(2, 0.0), (3, run_emitted.FOLLOW_SECS)]


def test_an_actor_that_stops_answering_ends_the_stream_with_an_error_event(monkeypatch):
    response, _ = follow(monkeypatch, [([op(2, "a")], None, "running"),
                                       FlowError("unavailable", "actor/0 did not answer")])
    assert response.ended and response.body.endswith(
        b'event: error\ndata: {"code":"unavailable","message":"actor/0 did not answer"}\n\n')


def test_a_reader_gone_ends_the_stream_quietly(monkeypatch):
    response, client = follow(monkeypatch, [([op(2, "a")], None, "running")], gone=True)
    assert response.body == b"" and not response.ended and client.asked == []
