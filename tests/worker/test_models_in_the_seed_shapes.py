"""A seed client reads the worker: ``GET /models`` in the seed's shapes, errors with FastAPI's ``detail``.

The seed's server (../shared/seeds/000, section 2.3) answers ``available_models``
as ``{id: metadata}`` (``id, name, type, framework, version``) and
``loaded_models`` as ``{id: name}``; its error bodies carry ``detail``.
"""
from __future__ import annotations

import httpx
import pydantic

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread


class SeedMetadata(pydantic.BaseModel):
    """The seed's model metadata, exactly its fields (extra ones are allowed beside them)."""

    id: str
    name: str
    type: str
    framework: str
    version: str


class SeedModels(pydantic.BaseModel):
    available_models: dict[str, SeedMetadata]
    loaded_models: dict[str, str]


def test_models_and_errors_read_by_a_seed_client(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"spam": {"size": MiB}, "images": {"size": MiB}, "idle": {"size": MiB}})
    store.put(store.get("spam").model_copy(update={"name": "bert-tiny-spam", "version": "1.0.0"}))
    with serve_in_thread(ballast_app(store, budget=10 * MiB)) as url, httpx.Client(base_url=url) as client:
        before = SeedModels.model_validate(client.get("/models").json())
        assert before.loaded_models == {}
        for model in ("spam", "images"):
            assert client.post("/predict", json={"model_id": model, "input_data": [1]}).status_code == 200
        after = SeedModels.model_validate(client.get("/models").json())
        raw = client.get("/models").json()
        missing = client.post("/predict", json={"model_id": "nope", "input_data": [1]})
        malformed = client.post("/predict", json={"input_data": [1]})

    assert sorted(after.available_models) == ["idle", "images", "spam"]
    spam = after.available_models["spam"]
    assert (spam.id, spam.name, spam.type, spam.framework, spam.version) == (
        "spam", "bert-tiny-spam", "tensor", "torchvision", "1.0.0")
    assert after.loaded_models == {"images": "images", "spam": "bert-tiny-spam"}  # id -> name, what is loaded now
    assert raw["available_models"]["spam"]["memory_bytes"] == MiB  # hotset's fields stand beside the seed's
    for response, status, words in ((missing, 404, "'nope'"), (malformed, 422, "model_id")):
        body = response.json()
        assert response.status_code == status and words in body["detail"]  # what the seed's client reads
        assert body["error"] == body["detail"]  # and what Triton-style clients read
