"""A worker with many models: what a copy shares, a /models that pages, metrics bounded by a number of models."""
from __future__ import annotations

import json
import shutil

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread
from hotset_worker.frameworks.shared_tokenizers import TokenizerCache, fingerprint
from hotset_common.model_series import DEFAULT_MAX_MODEL_SERIES
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


def samples(metrics: WorkerMetrics) -> dict[str, float]:
    """model label -> the number of samples that name it (the whole exposition, as Prometheus reads it)."""
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if "model" in sample.labels:
                counted[sample.labels["model"]] = counted.get(sample.labels["model"], 0) + 1
    return counted


def summed(metrics: WorkerMetrics, name: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics.exposition().decode())
               for sample in family.samples if sample.name == name)


def serve_once(metrics: WorkerMetrics, spec, size: int) -> None:
    """What a copy's life sends the metrics: its load, its size, one request, its wait for room."""
    metrics.load_finished(spec, 0.2, True)
    metrics.model_bytes(spec, size)
    metrics.request_started(spec)
    metrics.queue_left(spec, 0.001, "admitted")
    metrics.request_finished(spec, 200, 0.004)
    metrics.request_ended(spec)


def test_ten_thousand_held_models_export_the_series_of_at_most_the_limit(tmp_path) -> None:
    now = [0.0]
    metrics = WorkerMetrics("p", 2**40, max_models=DEFAULT_MAX_MODEL_SERIES, idle_s=300, clock=lambda: now[0])
    specs = [ballast.make_spec(f"m{i:05d}", tmp_path) for i in range(10_000)]
    for i, spec in enumerate(specs):
        serve_once(metrics, spec, MiB + i)
    counted = samples(metrics)
    per_model = max(n for model, n in counted.items() if model != OTHER_MODELS)
    assert len(counted) == DEFAULT_MAX_MODEL_SERIES + 1 and set(counted) - {OTHER_MODELS} == {s.id for s in specs[:500]}
    total = sum(counted.values())
    assert total <= DEFAULT_MAX_MODEL_SERIES * per_model + 2 * per_model  # the models with series, and _other
    print(f"10,000 held models: {total} per-model samples ({per_model} per model with series)")
    # Sums over models stay exact: requests, loads, and the bytes the 10,000 copies hold.
    assert summed(metrics, "hotset_requests_total") == 10_000
    assert summed(metrics, "hotset_model_loads_total") == 10_000
    assert summed(metrics, "hotset_model_bytes") == sum(MiB + i for i in range(10_000))
    assert summed(metrics, "hotset_inflight_requests") == 0
    metrics.before_scrape()
    assert summed(metrics, "hotset_model_series") == DEFAULT_MAX_MODEL_SERIES


def test_a_model_idle_past_its_time_gives_its_series_to_the_next_and_its_gauges_to_the_aggregate(tmp_path) -> None:
    now = [0.0]
    metrics = WorkerMetrics("p", 2**40, max_models=2, idle_s=60, clock=lambda: now[0])
    a, b, c = (ballast.make_spec(name, tmp_path) for name in "abc")
    for spec in (a, b, c):
        serve_once(metrics, spec, MiB)
    assert set(samples(metrics)) == {"a", "b", OTHER_MODELS}
    metrics.request_started(c)  # c is busy, counted in the aggregate's gauge
    now[0] = 30.0
    serve_once(metrics, a, MiB)  # a is still in use
    now[0] = 70.0
    metrics.request_finished(c, 200, 0.5)  # b idle for 70 s: its series go, c gets its own
    assert set(samples(metrics)) == {"a", "c", OTHER_MODELS}
    text = metrics.exposition().decode()
    assert 'hotset_inflight_requests{framework="torchvision",model="c",pod="p"} 1.0' in text
    assert 'hotset_inflight_requests{framework="torchvision",model="_other",pod="p"} 0.0' in text
    assert 'hotset_model_bytes{framework="torchvision",model="_other",pod="p"} 1.048576e+06' in text  # b's copy
    assert summed(metrics, "hotset_model_bytes") == 3 * MiB
    metrics.model_bytes(b, None)  # b's copy went: its bytes leave the aggregate
    metrics.request_ended(c)
    assert summed(metrics, "hotset_model_bytes") == 2 * MiB and summed(metrics, "hotset_inflight_requests") == 0
    assert 'model="b"' not in metrics.exposition().decode()


async def test_a_worker_holding_more_models_than_the_limit_names_only_the_limit(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {f"m{i}": {"size": MiB} for i in range(12)})
    metrics = WorkerMetrics("p", 100 * MiB, max_models=4)
    manager = ballast.manager(store, budget=100 * MiB, observer=metrics, admission_control=False)
    try:
        for i in range(12):
            async with manager.use(f"m{i}"):
                metrics.request_finished(store.get(f"m{i}"), 200, 0.01)
            await manager.settled()
        assert len(manager.loaded_ids()) == 12  # all twelve held, four with series of their own
        counted = samples(metrics)
        assert set(counted) == {"m0", "m1", "m2", "m3", OTHER_MODELS}
        assert summed(metrics, "hotset_requests_total") == 12
        assert summed(metrics, "hotset_model_bytes") == 12 * MiB
    finally:
        await manager.close()
