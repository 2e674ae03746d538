"""Property-based fuzzing of the worker's and the router's OpenAPI descriptions (schemathesis):
whatever a client sends that the description allows, or nearly allows, no answer is a 5xx
(but a readiness probe's documented 503, "not ready yet").

Real processes: two ballast workers and a router in front of them. Hypothesis generates the
requests from each server's own /openapi.json (the inference routes are described there too,
request bodies included); a 5xx answer fails the test with the request that caused it.
"""
from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from gateway_helpers import write_ballast_store

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("HOTSET_FUZZ_EXAMPLES", "40"))  # per operation; more for a deeper run
ADMIN = "fuzz-admin"


@pytest.fixture(scope="module")
def servers(module_procs, tmp_path_factory):
    store = write_ballast_store(tmp_path_factory.mktemp("fuzz"), {"a": {"mib": 1}, "b": {"mib": 1}})
    workers = module_procs.workers(store, ["16Mi", "16Mi"])
    router = module_procs.router(workers, args=["--admin-token", ADMIN])
    return workers[0], router


def aimed(drawn: tuple) -> object:
    """Most generated names miss every model (404): aim a share of the cases at real models (and
    the admin token), so bodies reach the decoders, the loads and the frameworks."""
    case, model, admin = drawn
    if model is not None:
        if isinstance(case.path_parameters, dict) and "name" in case.path_parameters:
            case.path_parameters["name"] = model
        if isinstance(case.body, dict) and "model_id" in case.body:
            case.body["model_id"] = model
    if admin:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN}"}
    return case


def fuzz(url: str) -> int:
    """Every operation of the server's description, EXAMPLES generated requests each (positive and
    negative: values that break the schema too); the number of requests sent."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    sent = 0
    codes: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()

        generated = (operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
                     | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @given(case=st.tuples(generated, st.sampled_from([None, "a", "b"]), st.booleans()).map(aimed))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:
            nonlocal sent
            sent += 1
            response = case.call(timeout=30)
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
            # A readiness probe's 503 is its documented answer ("not ready yet"), not a failure.
            probe = case.method == "GET" and case.formatted_path.endswith("/ready")
            assert response.status_code < 500 or (probe and response.status_code == 503), (
                f"{case.method} {case.formatted_path} -> {response.status_code} {response.text[:300]}\n"
                f"{case.as_curl_command()}")

        run()
    print(f"{url}: {sent} requests, answers by status {dict(sorted(codes.items()))}")
    return sent


def test_the_worker_answers_no_generated_request_with_a_5xx(servers) -> None:
    worker, _ = servers
    assert fuzz(worker.url) > 100


def test_the_router_answers_no_generated_request_with_a_5xx(servers) -> None:
    _, router = servers
    assert fuzz(router.url) > 100
