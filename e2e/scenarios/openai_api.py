"""The OpenAI API through the router's Service, on the chart's install (worker identity on).

What a user of the official clients meets: ``kubectl apply`` of a causal LM
(``tiny-chat``) and a sentence encoder (``mini-embed``), both built by
``hotset-samples`` and read from the ``models`` claim like every sample, then
chat completions whole and streamed (server-sent events read to ``[DONE]``),
embeddings, and a malformed body refused with OpenAI's short error. Plain
HTTP, so the scenario reads the wire itself rather than trusting a client
library to hide it.
"""
from __future__ import annotations

import json
import math
from typing import Any

import httpx

from hotset_common import openai_wire
from scenarios.platform import Kube, Platform, is_true, sample, wait_for
from scenarios.served_models import CATALOG_PROPAGATION_S, POOL_SELECTOR

CHAT_MODEL = "tiny-chat"
EMBEDDING_MODEL = "mini-embed"
SKY = [{"role": "user", "content": "what color is the sky?"}]
# An OpenAI error names the problem in a sentence; a long one would be a dump of the request.
SHORT_MESSAGE_CHARS = 300


def post(platform: Platform, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{platform.router_url}{route}", json=body, headers=platform.router_headers, timeout=120)


def first_answer(platform: Platform, route: str, body: dict[str, Any]) -> httpx.Response:
    """The first request may race the pool learning of the new ServedModel (404): retry those only."""
    def attempt() -> httpx.Response | None:
        answer = post(platform, route, body)
        return None if answer.status_code == 404 else answer

    return wait_for(f"the router to serve {body['model']} on {route}", attempt, CATALOG_PROPAGATION_S, interval=1.0)


def stream_events(platform: Platform, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """A streamed chat answer: its response and the data of every server-sent event, to ``[DONE]``."""
    events: list[str] = []
    with httpx.stream("POST", f"{platform.router_url}{openai_wire.CHAT_COMPLETIONS}", json={**body, "stream": True},
                      headers=platform.router_headers, timeout=120) as answer:
        assert answer.status_code == 200, answer.read()[:500]
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    return answer, events


def openai_api_served(platform: Platform, kube: Kube) -> None:
    """tiny-chat and mini-embed applied as ServedModels: chat completions (whole, then streamed to
    [DONE]) and embeddings answer 200 through the router, which presents its own token (a pool
    pod refuses the route without it); a bad body is a 400 with a short message naming the field."""
    kube.apply([sample(CHAT_MODEL), sample(EMBEDDING_MODEL)])
    try:
        for model in (CHAT_MODEL, EMBEDDING_MODEL):
            wait_for(f"{model} Accepted", lambda: is_true(kube.served_model(model), "Accepted"), 60)
        pod = kube.worker_pods(POOL_SELECTOR)[0]["metadata"]["name"]
        bare = httpx.post(f"{platform.worker_url(pod)}{openai_wire.CHAT_COMPLETIONS}",
                          json={"model": CHAT_MODEL, "messages": SKY}, timeout=30)
        assert bare.status_code == 401, f"a worker answered without the token: {bare.status_code} {bare.text[:200]}"

        whole = first_answer(platform, openai_wire.CHAT_COMPLETIONS, {"model": CHAT_MODEL, "messages": SKY,
                                                                       "temperature": 0})
        assert whole.status_code == 200, whole.text[:500]
        body = whole.json()
        (choice,) = body["choices"]
        assert body["object"] == "chat.completion" and body["model"] == CHAT_MODEL, body
        assert choice["message"]["role"] == "assistant" and "blue" in choice["message"]["content"], choice
        assert body["usage"]["completion_tokens"] > 0, body

        answer, events = stream_events(platform, {"model": CHAT_MODEL, "messages": SKY, "temperature": 0})
        assert answer.headers["content-type"].startswith(openai_wire.EVENT_STREAM), answer.headers
        assert events and events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(event) for event in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert len(chunks) > 2 and text == choice["message"]["content"], (len(chunks), text)

        embedded = first_answer(platform, openai_wire.EMBEDDINGS, {"model": EMBEDDING_MODEL,
                                                                   "input": ["the sky is blue", "hello"]})
        assert embedded.status_code == 200, embedded.text[:500]
        vectors = [item["embedding"] for item in embedded.json()["data"]]
        assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
        assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vectors)  # normalised

        bad = post(platform, openai_wire.CHAT_COMPLETIONS, {"model": CHAT_MODEL, "messages": "not a list"})
        error = bad.json().get("error") or {}
        assert 400 <= bad.status_code < 500 and isinstance(error, dict), (bad.status_code, bad.text[:500])
        assert "messages" in error["message"] and len(error["message"]) < SHORT_MESSAGE_CHARS, error
        print(f"OpenAI through the router: chat {choice['message']['content']!r}, {len(chunks)} stream chunks, "
              f"embeddings of {len(vectors[0])}; a bad body: {bad.status_code} {error['message']!r}")
    finally:
        kube.delete("servedmodel", CHAT_MODEL, EMBEDDING_MODEL)
