"""The API contract: /openapi.json and the gateway's route table agree, and a property-based
run against the real server finds no 5xx and no response the document does not allow."""
import re

import pytest

from gateway import openapi


def _normalise(path: str) -> str:
    return re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", path)


def test_the_document_and_the_route_table_agree(tmp_path):
    from agentos.config import Config
    from gateway.app import Gateway
    gateway = Gateway(Config(), "ipc:///nonexistent", 0, __import__("logging").getLogger("test"))
    routes = {(r.method.lower(), _normalise(r.path)) for r in gateway.routes()}
    documented = {(method, path) for path, ops in openapi.PATHS.items() for method in ops}
    assert routes == documented, (routes ^ documented)
    doc = openapi.document()
    assert doc["openapi"] == "3.1.0"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_the_server_serves_the_document(shared_server):
    from harness import get_json
    status, headers, doc = get_json(f"{shared_server.url}/openapi.json")
    assert status == 200 and doc == openapi.document()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_property_based_run_finds_no_5xx_and_no_violation(make_server, make_worker):
    import schemathesis
    server = make_server({"mock": {"ttft_ms": 1}})
    make_worker(server)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                     status_code_conformance)
    from hypothesis import HealthCheck, given, settings

    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path in ("/metrics",):
            continue

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(base_url=server.url, timeout=30)
            for fn in (not_a_server_error, status_code_conformance, content_type_conformance,
                       response_schema_conformance):
                try:
                    case.validate_response(response, checks=(fn,))
                except Exception as exc:  # collected, reported together below
                    failures.append(f"{operation.method.upper()} {operation.path}: {type(exc).__name__}: "
                                    f"{str(exc)[:300]}")
                    return
        check()
    assert not failures, "\n".join(failures[:20])
