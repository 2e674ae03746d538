"""vllm models through the router: unbuffered streams, prefix-aware routing, LoRA adapters where their base is.

Two real workers whose vllm engines are the test-only stand-in
(hotset_testing/standin_vllm.py, a paced generator: one word every
50 ms), behind a real router; requests come from the official `openai`
client. Which engine answered is in each answer's ``system_fingerprint``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import sys
import time

import httpx
import openai
import pytest

from gateway_helpers import ROOT, copies, local_stack, wait_for, worker_models

pytestmark = pytest.mark.slow
STANDIN = ROOT / "tests" / "hotset_testing" / "standin_vllm.py"
TOKEN_DELAY_S = 0.05
SYSTEM = "you are the support assistant of a shop that sells bicycles. " * 6  # a shared prefix of ~360 characters


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("engines")
    models = [
        {"id": "paced", "memory": "128Mi", "replicas": {"min": 2, "max": 2}},
        {"id": "solo", "memory": "128Mi", "replicas": {"min": 1, "max": 1}, "engineArgs": {"enable_lora": True}},
        {"id": "solo-sql", "baseModel": "solo"},
    ]
    for model in models:
        path = folder / model["id"]
        path.mkdir()
        (path / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
        model.update(framework="vllm", task="text-generation", source=f"file://{path}")
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": models}))
    command = f"{sys.executable} {STANDIN} --standin-token-delay-s {TOKEN_DELAY_S}"
    stack = local_stack.start_stack(store, workers=2, router_port=None, with_triton=False, memory_budget="1Gi",
                                    work_dir=folder / "stack", router_args=["--sync-interval", "0.2"],
                                    worker_args=["--vllm-command", command, "--vllm-device-memory", "1Gi"])
    try:
        wait_for(lambda: len(copies(stack.router.url, "paced")) == 2 and copies(stack.router.url, "solo"),
                 "the minimum copies to load", timeout=60)
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.router.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def engine_of(client: openai.OpenAI, system: str, question: str = "where is my order?") -> str:
    answer = client.chat.completions.create(model="paced", max_tokens=2, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}])
    return answer.system_fingerprint


def test_events_pass_through_the_router_as_the_engine_makes_them(client) -> None:
    started = time.perf_counter()
    arrivals = []
    for chunk in client.completions.create(model="paced", prompt="go", max_tokens=20, stream=True):
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 20
    # The engine makes one word every 50 ms, about a second in all: the first word is here long before
    # the last one exists (a buffering hop would deliver all twenty at the end).
    assert arrivals[0] < arrivals[-1] - 10 * TOKEN_DELAY_S
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
    assert gaps[len(gaps) // 2] > TOKEN_DELAY_S / 2  # spread out as they were made, not bunched


def test_the_same_prompt_prefix_goes_to_the_same_copy(client) -> None:
    engines = {engine_of(client, SYSTEM, f"question number {i}") for i in range(6)}
    assert len(engines) == 1  # one copy holds this prefix's cache


def test_different_prefixes_use_every_copy(client) -> None:
    engines = collections.Counter(engine_of(client, f"system prompt number {i}: be brief.") for i in range(24))
    assert len(engines) == 2 and min(engines.values()) >= 3


def test_a_busy_copy_spills_its_prefix_to_the_next(client, stack) -> None:
    def stream(index: int) -> str:
        chunks = list(client.chat.completions.create(model="paced", max_tokens=30, stream=True, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {index}"}]))
        return next(c.system_fingerprint for c in chunks if c.system_fingerprint)

    with concurrent.futures.ThreadPoolExecutor(12) as pool:  # 12 streams of 1.5 s at once, one prefix
        engines = collections.Counter(pool.map(stream, range(12)))
    assert len(engines) == 2  # past its room the favourite's prefix spilled...
    assert max(engines.values()) >= 8  # ...but only past its room (8 at once)


def test_an_adapter_goes_to_the_pod_where_its_base_is_loaded(client, stack) -> None:
    (holder,) = copies(stack.router.url, "solo")
    answer = client.completions.create(model="solo-sql", prompt="select", max_tokens=3)
    assert answer.choices[0].text.startswith("[solo-sql]")
    for worker in stack.workers:
        held = worker_models(worker.url)
        if worker.name == holder:
            assert held["solo-sql"] == "READY" and held["solo"] == "READY"
        else:
            assert "solo-sql" not in held and "solo" not in held  # no second engine for the adapter


def test_the_engines_own_4xx_reaches_the_client_as_it_was(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="paced", prompt="hi", max_tokens=5000)  # over the engine's context
    assert "maximum context length" in refused.value.body["message"]


def test_models_lists_the_engines_models_and_adapters(stack) -> None:
    listed = {m["id"]: m["parent"] for m in httpx.get(f"{stack.router.url}/v1/models", timeout=5).json()["data"]}
    assert listed == {"paced": None, "solo": None, "solo-sql": "solo"}
