"""A canary on the OpenAI routes: the router splits chat requests between the model's version and its
canary as it splits seed and OIP requests, and every answer names the model that was asked for and
the version that computed it (issue 18: the OpenAI routes had no canary split).

A real router in front of a real worker serving the tiny-chat sample as version 1 with a 50% canary
of version 2 (the same weights: the version header says which copy answered).
"""
from __future__ import annotations

import collections
import json

import httpx
import pytest

from gateway_helpers import ROOT, local_stack, wait_for

pytestmark = pytest.mark.slow
SAMPLES = ROOT / "build/models/model-store.json"
CHAT = {"model": "tiny-chat", "max_tokens": 2, "messages": [{"role": "user", "content": "what color is the sky?"}]}


def test_a_canary_takes_its_share_of_chat_requests_and_answers_as_the_model(procs, tmp_path) -> None:
    chat = next(spec for spec in json.loads(SAMPLES.read_text())["models"] if spec["id"] == "tiny-chat")
    store = tmp_path / "model-store.json"
    store.write_text(json.dumps({"models": [{**chat, "version": "1", "rollout": {
        "canary": {"version": "2", "source": chat["source"], "weight": 50}}}]}))
    worker = local_stack.start_worker("worker-1", store, procs.log_dir, "1Gi", extra_args=["--min-residency-s", "0"])
    procs.started.append(worker)
    local_stack.wait_http(worker, "/v2/health/ready", 90)
    router = procs.router([worker])

    def ask() -> httpx.Response:
        answer = httpx.post(f"{router.url}/v1/chat/completions", json=CHAT, timeout=120)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["model"] == "tiny-chat"  # a canary answers as the model asked for
        return answer

    wait_for(lambda: ask().headers.get("x-hotset-model-version") == "2", "the router to learn of the canary", timeout=60)
    versions = collections.Counter(ask().headers["x-hotset-model-version"] for _ in range(40))
    assert set(versions) == {"1", "2"} and min(versions.values()) >= 5, versions
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=120) as stream:
        assert stream.status_code == 200 and stream.headers["x-hotset-model-version"] in ("1", "2")
        assert all('"model": "tiny-chat"' in line or '"model":"tiny-chat"' in line
                   for line in stream.iter_lines() if line.startswith("data: {"))
