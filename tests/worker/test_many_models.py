"""A worker with many models: what a copy shares, a /models that pages, metrics that stay bounded."""
from __future__ import annotations

import json
import shutil

import httpx

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread
from hotset_worker.frameworks.shared_tokenizers import TokenizerCache, fingerprint
from hotset_worker.metrics import OTHER_MODELS, WorkerMetrics
from hotset_worker.models_report import ModelsReport



def test_copies_whose_tokenizer_files_are_the_same_share_one_tokenizer(sample_store, tmp_path) -> None:
    from transformers import AutoTokenizer

    source = sample_store.parent / "sentiment"
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(source, first)
    shutil.copytree(source, second)
    config = json.loads((second / "config.json").read_text())
    (second / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.2}))
    assert fingerprint(first) == fingerprint(second)  # the model's config differs; the tokenizer does not
    cache = TokenizerCache(keep_recent=1)
    build = lambda folder: (lambda: AutoTokenizer.from_pretrained(str(folder), local_files_only=True))  # noqa: E731
    a, b = cache.acquire(first, build(first)), cache.acquire(second, build(second))
    assert a is b and cache.built == 1 and cache.live() == 1
    cache.release(a)
    cache.release(b)
    assert cache.live() == 0
    assert cache.acquire(first, build(first)) is a and cache.built == 1  # the last one stays after its copies
    tokenizer_file = next(name for name in ("tokenizer.json", "vocab.txt") if (second / name).is_file())
    (second / tokenizer_file).write_text((second / tokenizer_file).read_text() + "\n")
    assert cache.acquire(second, build(second)) is not a and cache.built == 2  # other bytes: its own


def test_models_pages_through_the_catalog_and_rebuilds_only_what_changed(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i:02d}": {"size": MiB} for i in range(25)})
    app = ballast_app(store, budget=100 * MiB)
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        assert client.post("/predict", json={"model_id": "m03", "input_data": [1]}).status_code == 200
        seen, after = [], ""
        while True:
            page = client.get("/models", params={"limit": 10, "after": after}).json()
            seen += list(page["available_models"])
            assert set(page["loaded_models"]) <= set(page["available_models"])
            if not page["next"]:
                break
            after = page["next"]
        assert seen == sorted(f"m{i:02d}" for i in range(25))
        whole = client.get("/models").json()
        assert list(whole["available_models"]) == seen and whole["loaded_models"] == {"m03": "m03"}
        assert "next" not in whole  # the seed's shape, unchanged
        assert client.get("/models", params={"limit": 0}).status_code == 422


async def test_a_second_models_report_builds_nothing_new(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i}": {"size": MiB} for i in range(5)})
    manager = ballast.manager(store, budget=100 * MiB)
    try:
        report = ModelsReport(manager)
        report.whole()
        assert report.built == 5
        report.whole()
        report.page(2, "m1")
        assert report.built == 5
        async with manager.use("m2"):
            pass
        report.whole()
        assert report.built == 6  # m2's measured size changed its entry, and only its
    finally:
        await manager.close()


async def test_per_model_series_exist_only_for_held_and_recent_models(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i}": {"size": MiB} for i in range(12)})
    metrics = WorkerMetrics("p", 100 * MiB, recent_models=2)
    manager = ballast.manager(store, budget=100 * MiB, max_models=2, observer=metrics, admission_control=False)
    try:
        for i in range(12):
            async with manager.use(f"m{i}"):
                metrics.request_finished(store.get(f"m{i}"), 200, 0.01)
            await manager.settled()
        # held: two copies; recent: the last two gone; the aggregate; nothing of the other eight
        import re

        text = metrics.exposition().decode()
        named = set(re.findall(r'model="([^"]+)"', text))
        assert len(named) <= 2 + 2 and set(manager.loaded_ids()) <= named
        gone = next(f"m{i}" for i in range(12) if f"m{i}" not in named)
        metrics.request_finished(store.get(gone), 200, 0.01)  # a model neither held nor recent
        text = metrics.exposition().decode()
        assert f'model="{gone}"' not in text
        assert f'hotset_requests_total{{code="200",framework="torchvision",model="{OTHER_MODELS}",pod="p"}} 1.0' in text
    finally:
        await manager.close()
