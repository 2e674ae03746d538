"""The OpenAI API through the router, with the official `openai` client, against real processes.

A router in front of two real workers serving the sample models (the
tiny-chat causal LM and the mini-embed encoder among them), started the way
``make run`` starts them, with the workers' API token on as in every chart
install (the workers answer only callers holding it; the router holds it).
Every request goes through the router; the models load on demand like every
other model.
"""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import openai
import pytest

from gateway_helpers import ROOT, copies, local_stack, wait_for, worker_metric

pytestmark = pytest.mark.slow
SAMPLES = ROOT / "build/models/model-store.json"
SKY = [{"role": "user", "content": "what color is the sky?"}]
TOKEN = "openai-test-worker-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not SAMPLES.exists():
        pytest.fail(f"{SAMPLES} is missing: run `.venv/bin/hotset-samples --out build/models` (make install does)")
    stack = local_stack.start_stack(SAMPLES, workers=2, router_port=None, with_triton=False, memory_budget="1Gi",
                                    work_dir=tmp_path_factory.mktemp("stack"), worker_args=["--api-token", TOKEN],
                                    router_args=["--sync-interval", "0.2", "--worker-token", TOKEN])
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.router.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def test_the_workers_answer_only_callers_with_their_token(stack) -> None:
    """What makes every test here one of the token-protected shape: a worker refuses the OpenAI
    routes without the token, and the router's calls (whole and streamed) carry it."""
    worker = stack.workers[0].url
    for path, body in [("/v1/chat/completions", {"model": "tiny-chat", "messages": SKY}),
                       ("/v1/embeddings", {"model": "mini-embed", "input": "hi"})]:
        assert httpx.post(worker + path, json=body, timeout=30).status_code == 401, path


def test_models_lists_the_generative_and_embedding_models(client) -> None:
    models = {model.id for model in client.models.list()}
    assert {"tiny-chat", "mini-embed"} <= models
    assert "sentiment" not in models and "iris" not in models  # a classifier or a tensor model is no OpenAI model


def test_a_chat_request_loads_the_model_where_placement_says_and_answers(client, stack) -> None:
    answer = client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0)
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == "the sky is blue."
    assert choice.finish_reason == "stop"  # the model ended its answer itself
    assert answer.usage.completion_tokens > 0 and answer.usage.prompt_tokens > 0
    assert answer.model == "tiny-chat" and answer.object == "chat.completion"
    assert len(copies(stack.router.url, "tiny-chat")) == 1  # loaded once, on one pod


def test_a_stream_arrives_token_by_token_and_adds_up_to_the_whole_answer(client) -> None:
    messages = [{"role": "user", "content": "say hello"}]
    whole = client.chat.completions.create(model="tiny-chat", messages=messages, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == whole.choices[0].message.content == "hello! how can i help you today?"
    assert len(texts) >= 8  # one event per token, not one per answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # the usage chunk comes last


def test_completions_take_a_prompt_and_stop_sequences(client) -> None:
    full = client.completions.create(model="tiny-chat", prompt="once upon a time", temperature=0, max_tokens=20)
    assert full.choices[0].text == " a small model learned to talk."
    cut = client.completions.create(model="tiny-chat", prompt="once upon a time", temperature=0, max_tokens=20,
                                    stop=[" learned"])
    assert cut.choices[0].text == " a small model" and cut.choices[0].finish_reason == "stop"
    short = client.completions.create(model="tiny-chat", prompt="once upon a time", temperature=0, max_tokens=2)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2


def test_embeddings_match_the_models_own_predictions(client, stack) -> None:
    texts = ["a wonderful little model", "hello"]
    answer = client.embeddings.create(model="mini-embed", input=texts)  # the client asks for base64 and decodes it
    floats = client.embeddings.create(model="mini-embed", input=texts, encoding_format="float")
    predicted = httpx.post(f"{stack.router.url}/predict", json={"model_id": "mini-embed", "input_data": texts},
                           timeout=60).json()["predictions"]
    for index, row in enumerate(predicted):
        np.testing.assert_allclose(answer.data[index].embedding, row["embedding"], atol=1e-6)
        np.testing.assert_allclose(floats.data[index].embedding, row["embedding"], atol=1e-6)
    assert answer.usage.prompt_tokens > 0


@pytest.mark.parametrize(("request_body", "status", "param"), [
    ({"model": "no-such-model", "messages": SKY}, 404, "model"),
    ({"model": "tiny-chat", "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": 42}]}, 400, "messages.0.content"),
    ({"model": "tiny-chat", "messages": []}, 400, "messages"),
    ({"model": "tiny-chat", "messages": SKY, "max_tokens": 100000}, 400, "max_tokens"),
    ({"model": "tiny-chat", "messages": SKY, "n": 2}, 400, "n"),
    ({"model": "sentiment", "messages": SKY}, 400, "model"),
    ({"model": "tiny-chat", "messages": SKY, "seed": 2**70}, 400, "seed"),  # was a 500 (torch.manual_seed overflowed)
])
def test_bad_requests_get_a_4xx_in_openais_shape_naming_the_field(client, stack, request_body, status, param) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**request_body)
    assert refused.value.status_code == status
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"
    assert refused.value.body["message"]
    # Nothing else broke: the next good request is served.
    assert client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0).choices[0].message.content


@pytest.mark.parametrize("seed", [-(2**63), -1, 0, 2**63 - 1])
def test_any_64_bit_seed_is_taken_and_repeats_its_answer(client, seed) -> None:
    def ask() -> str:
        return client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=1.0, seed=seed,
                                              max_tokens=8).choices[0].message.content
    assert ask() == ask()


@pytest.mark.parametrize(("body", "param", "says"), [
    (b"{not json", None, "JSON"),
    (b'["a list"]', None, "object"),
    (b'{"messages": []}', "model", "model"),
])
def test_a_body_without_json_or_a_model_is_a_400_in_openais_shape(stack, body, param, says) -> None:
    answer = httpx.post(f"{stack.router.url}/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and says in error["message"]


def test_a_client_that_leaves_mid_stream_stops_the_generation_and_frees_the_model(client, stack) -> None:
    client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0)  # loaded
    (pod,) = copies(stack.router.url, "tiny-chat")
    worker = next(w for w in stack.workers if w.name == pod)
    before = worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat")
    stream = client.completions.create(model="tiny-chat", prompt="once upon a time", max_tokens=240, temperature=1.0,
                                       stream=True, extra_body={"min_tokens": 240})  # vLLM's extension
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()  # the client goes away after three tokens of 240

    def inflight() -> int:
        report = httpx.get(f"{worker.url}/status", headers=AUTH, timeout=5).json()
        return next(c["inflight"] for c in report["models"] if c["id"] == "tiny-chat")

    wait_for(lambda: inflight() == 0 and worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat") > before,
             "the worker to finish the abandoned request", timeout=30)
    generated = worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat") - before
    assert generated < 120, f"{generated} tokens generated for a client that left after 3"


def test_a_client_that_leaves_before_a_whole_answer_stops_the_generation(stack) -> None:
    """A whole (not streamed) answer starts only when it is done, so the router must watch for the
    client leaving while it waits, and close the worker's connection: the worker then stops."""
    long = {"model": "tiny-chat", "prompt": "once upon a time", "max_tokens": 240, "min_tokens": 240, "temperature": 1.0}
    url = f"{stack.router.url}/v1/completions"
    assert httpx.post(url, json={**long, "max_tokens": 2, "min_tokens": 0}, timeout=120).status_code == 200  # loaded
    started = time.perf_counter()
    assert httpx.post(url, json=long, timeout=120).status_code == 200  # timed whole
    whole_s = time.perf_counter() - started
    (pod,) = copies(stack.router.url, "tiny-chat")
    worker = next(w for w in stack.workers if w.name == pod)
    before = worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up a quarter of the way in
        httpx.post(url, json=long, timeout=httpx.Timeout(120, read=whole_s / 4))
    wait_for(lambda: worker_metric(worker.url, "hotset_inflight_requests", model="tiny-chat") == 0
             and worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat") > before,
             "the worker to stop the abandoned request", timeout=30)
    generated = worker_metric(worker.url, "hotset_output_tokens_total", model="tiny-chat") - before
    assert generated < 180, f"{generated:.0f} of 240 tokens generated for a client that left a quarter of the way in"


def test_token_metrics_are_reported_per_model(client, stack) -> None:
    client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0, stream=True).close()
    list(client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0, stream=True))
    (pod,) = copies(stack.router.url, "tiny-chat")
    url = next(w.url for w in stack.workers if w.name == pod)
    assert worker_metric(url, "hotset_time_to_first_token_seconds_count", model="tiny-chat") >= 1
    assert worker_metric(url, "hotset_time_per_output_token_seconds_count", model="tiny-chat") >= 1
    assert worker_metric(url, "hotset_output_tokens_per_second_count", model="tiny-chat") >= 1
    assert worker_metric(url, "hotset_output_tokens_total", model="tiny-chat") > 0


def test_concurrent_streams_are_each_whole(client) -> None:
    results: dict[int, str] = {}

    def ask(index: int) -> None:
        stream = client.chat.completions.create(model="tiny-chat", messages=SKY, temperature=0, stream=True)
        results[index] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert time.monotonic() - started < 120
    assert results == {i: "the sky is blue." for i in range(6)}
