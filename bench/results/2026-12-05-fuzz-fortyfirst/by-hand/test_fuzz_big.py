import pytest
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_big_fuzz(make_server, make_worker):
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
        @settings(max_examples=int(__import__('os').environ.get('N','300')), deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(base_url=server.url, timeout=90)
            for fn in (not_a_server_error, status_code_conformance, content_type_conformance,
                       response_schema_conformance):
                try:
                    case.validate_response(response, checks=(fn,))
                except Exception as exc:  # collected, reported together below
                    failures.append(f"{operation.method.upper()} {operation.path}: {type(exc).__name__}: "
                                    f"{str(exc)[:300]}")
                    return
        try:
            check()
        except BaseException as exc:
            failures.append(f'{operation.method.upper()} {operation.path}: RAISED {str(exc)[:600]}')
    print("FAILURES", len(failures)); print("\n".join(failures[:60])); import subprocess; print(subprocess.run(f"grep -rh -E \"ERROR|CRITICAL|exited|Traceback\" {server.work_dir} | sort | uniq -c | sort -rn | head -40", shell=True, capture_output=True, text=True).stdout); assert not failures
