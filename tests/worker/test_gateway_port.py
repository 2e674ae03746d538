"""The gateway port: what an Inference Extension gateway reaches on a worker, and nothing more.

A gateway that routes by the Gateway API Inference Extension sends each request straight to the
pod its endpoint picker chose, with no token of ours. A real ``hotset-worker`` process (the CLI,
so its two listening sockets are the ones a pod has) serving the tiny-chat sample, with a caller
check on its main port (one fixed token, the local stack's kind) and ``--gateway-port``: the
OpenAI routes, the probes and ``/metrics`` answer there unchecked; everything else there is 404,
and the main port still refuses a caller without the token.
"""
from __future__ import annotations

import json

import httpx
import pytest

from hotset_testing.processes import free_port
from hotset_testing.worker_server import worker_process
from hotset_worker import main as worker_main

pytestmark = pytest.mark.slow
MODEL = "tiny-chat"
TOKEN = "main-port-token"


@pytest.fixture(scope="module")
def ports(sample_store, tmp_path_factory):
    specs = json.loads(sample_store.read_text())["models"]
    store = tmp_path_factory.mktemp("store") / "model-store.json"
    store.write_text(json.dumps({"models": [spec for spec in specs if spec["id"] == MODEL]}))
    gateway = free_port()
    args = ["--model-store", str(store), "--api-token", TOKEN, "--gateway-port", str(gateway)]
    with worker_process(args, env={"HOTSET_MEMORY_BUDGET": "1Gi", "HF_HUB_OFFLINE": "1"}) as url:
        with httpx.Client(base_url=url, timeout=120) as main, \
                httpx.Client(base_url=f"http://127.0.0.1:{gateway}", timeout=120) as gateway_client:
            yield main, gateway_client


def test_the_gateway_port_serves_the_openai_routes_without_a_token(ports) -> None:
    main, gateway = ports
    listed = gateway.get("/v1/models")
    assert listed.status_code == 200, listed.text
    assert MODEL in {entry["id"] for entry in listed.json()["data"]}
    chat = gateway.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 3,
                                                      "messages": [{"role": "user", "content": "hello"}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    with gateway.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "once", "max_tokens": 3,
                                                         "stream": True}) as streamed:
        assert streamed.status_code == 200
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    # What the endpoint picker scrapes, and the kubelet's probes.
    assert gateway.get("/metrics").status_code == 200
    assert gateway.get("/v2/health/ready").status_code == 200


def test_the_main_port_still_checks_the_caller(ports) -> None:
    main, _ = ports
    refused = main.get("/v1/models")
    assert refused.status_code == 401, refused.text
    assert main.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("method, path", [
    ("GET", "/status"), ("GET", "/models"), ("GET", "/v2/repository/index"),
    ("POST", f"/v2/repository/models/{MODEL}/unload"), ("POST", f"/v2/models/{MODEL}/infer"),
    ("POST", "/predict"), ("GET", "/identity"),
])
def test_nothing_else_answers_on_the_gateway_port(ports, method: str, path: str) -> None:
    main, gateway = ports
    answer = gateway.request(method, path, json={})
    assert answer.status_code == 404, (path, answer.text)
    assert "not served on the gateway port" in answer.json()["error"]
    # The model is still there: nothing on the gateway port unloaded it.
    assert main.get(f"/v2/models/{MODEL}/ready", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("value", ["0", "-1", "70000", "http", "8080"])
def test_a_gateway_port_that_cannot_work_is_refused_at_start(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        worker_main.parse_settings(["--model-store", "store.json", "--port", "8080", "--gateway-port", value], {})
    assert "--gateway-port must be a port number other than --port" in capsys.readouterr().err
