"""oci:// pulled by the worker (image volumes off) from a real registry (the distribution registry on loopback).

The real ``hotset-worker`` loads the sample sentiment model pushed with oras-py (the client it
pulls with) as an ORAS artifact, and as an OCI image whose one tar+gzip layer is built here. The
registry speaks plain http, allowed as the pool's policy would (``--oci-plain-http``). Blob GETs
are counted in the registry's access log: a cached image is never pulled again.
"""
from __future__ import annotations

import concurrent.futures
import io
import json
import re
import tarfile
from pathlib import Path

import httpx
import pytest

from hotset_testing import oci_registry
from hotset_testing.worker_server import wait_until, worker_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    try:
        oci_registry.registry_binary()
    except oci_registry.RegistryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    with oci_registry.running(tmp_path_factory.mktemp("registry")) as server:
        yield server


def _layer(path: Path, folder: Path, extra: dict[str, bytes] | None = None) -> Path:
    """A tar+gzip image layer of `folder`'s files under ``./`` plus `extra` members as named."""
    with tarfile.open(path, "w:gz") as tar:
        for file in sorted(folder.iterdir()):
            tar.add(file, arcname=f"./{file.name}")
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def pushed(registry, sample_specs, tmp_path_factory):
    folder = Path(sample_specs["sentiment"].source.removeprefix("file://"))
    work = tmp_path_factory.mktemp("layers")
    digests = {"artifact": registry.push_folder("models/sentiment:v1", folder)}
    # Other contents (a marker each: the cache is keyed by manifest digest, identical ones would share).
    for name in ("ten",):
        marked = work / name
        marked.mkdir()
        for file in folder.iterdir():
            (marked / file.name).write_bytes(file.read_bytes())
        (marked / "VERSION").write_text(name)
        registry.push_folder(f"models/sentiment-{name}:v1", marked)
    digests["image"] = registry.push_image("models/sentiment-image:v1", [_layer(work / "image.tar.gz", folder)])
    registry.push_image("models/escape:v1", [_layer(work / "escape.tar.gz", folder, {"../outside.txt": b"no"})])
    return digests


def _entry(model_id: str, uri: str) -> dict:
    return {"id": model_id, "framework": "transformers", "task": "text-classification", "memory": "200Mi",
            "source": {"uri": uri}}


@pytest.fixture(scope="module")
def worker(registry, pushed, tmp_path_factory):
    root = tmp_path_factory.mktemp("worker")
    host = registry.host
    store = root / "models.json"
    store.write_text(json.dumps({"models": [
        _entry("by-tag", f"oci://{host}/models/sentiment:v1"),
        _entry("by-digest", f"oci://{host}/models/sentiment@{pushed['artifact']}"),
        _entry("image", f"oci://{host}/models/sentiment-image:v1"),
        _entry("ten", f"oci://{host}/models/sentiment-ten:v1"),
        _entry("no-tag", f"oci://{host}/models/sentiment:v404"),
        _entry("no-repo", f"oci://{host}/models/nothing-here:v1"),
        _entry("unreachable", "oci://127.0.0.1:9/models/sentiment:v1"),
        _entry("escape", f"oci://{host}/models/escape:v1"),
    ]}))
    cache = root / "cache"
    args = ["--model-store", str(store), "--memory-budget", "2Gi", "--source-cache", str(cache),
            "--source-cache-bytes", "1Gi", "--oci-image-volumes", "off", "--oci-plain-http", f"{host},127.0.0.1:9",
            "--failed-load-backoff-s", "0", "--request-timeout-s", "120"]
    with worker_process(args, timeout_s=120) as url, httpx.Client(base_url=url, timeout=180) as client:
        wait_until(lambda: client.get("/v2/health/ready").status_code == 200, timeout_s=120, what="worker readiness")
        client.cache = cache  # type: ignore[attr-defined]
        yield client


def _predict(worker: httpx.Client, model: str) -> httpx.Response:
    return worker.post("/predict", json={"model_id": model, "input_data": "a wonderful little model"})


def _metric(worker: httpx.Client, name: str, **labels: str) -> float:
    total = 0.0
    for line in worker.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _leftovers(worker: httpx.Client) -> list[Path]:
    return list((worker.cache / "tmp").iterdir())  # type: ignore[attr-defined]


def test_a_model_pulled_by_tag_serves_and_its_second_load_reads_the_cache(worker, registry) -> None:
    answer = _predict(worker, "by-tag")
    assert answer.status_code == 200, answer.text
    pulled = registry.blob_gets("models/sentiment")
    assert pulled == 5  # four files and the sample marker, each once
    assert worker.post("/v2/repository/models/by-tag/unload").status_code == 200
    again = _predict(worker, "by-tag")
    assert again.status_code == 200 and again.json()["predictions"] == answer.json()["predictions"]
    assert registry.blob_gets("models/sentiment") == pulled  # no second pull
    assert _metric(worker, "hotset_source_cache_hits_total", model="by-tag", scheme="oci") == 1


def test_a_digest_names_the_same_cache_entry_as_its_tag(worker, registry) -> None:
    assert _predict(worker, "by-tag").status_code == 200
    before = registry.blob_gets("models/sentiment")
    answer = _predict(worker, "by-digest")
    assert answer.status_code == 200, answer.text
    assert registry.blob_gets("models/sentiment") == before  # keyed by manifest digest: a hit
    assert _metric(worker, "hotset_source_cache_hits_total", model="by-digest", scheme="oci") == 1


def test_an_oci_image_with_a_tar_gzip_layer_serves_from_its_root(worker) -> None:
    answer = _predict(worker, "image")
    assert answer.status_code == 200, answer.text
    assert _metric(worker, "hotset_source_fetches_total", model="image", result="download") == 1


@pytest.mark.parametrize(("model", "named"), [
    ("no-tag", r"oci://127\.0\.0\.1:\d+/models/sentiment:v404.*tag 'v404' not found"),
    ("no-repo", r"oci://127\.0\.0\.1:\d+/models/nothing-here:v1.*not found in repository 'models/nothing-here'"),
    ("unreachable", r"oci://127\.0\.0\.1:9/models/sentiment:v1.*cannot reach registry 127\.0\.0\.1:9"),
    ("escape", r"oci://127\.0\.0\.1:\d+/models/escape:v1.*'\.\./outside\.txt' would be written outside"),
])
def test_bad_images_fail_the_load_naming_the_uri_evicting_nothing(worker, model, named) -> None:
    assert _predict(worker, "by-tag").status_code == 200  # loaded beside the failure
    answer = _predict(worker, model)
    assert answer.status_code == 500, answer.text
    assert re.search(named, answer.json()["detail"]), answer.json()["detail"]
    assert "by-tag" in worker.get("/models").json()["loaded_models"]  # nothing was evicted
    assert _leftovers(worker) == []  # and nothing half-pulled is left
    failed = [c for c in worker.get("/status").json()["models"] if c["id"] == model]
    assert failed and failed[0]["state"] == "FAILED" and re.search(named, failed[0]["reason"])


def test_ten_concurrent_requests_for_an_uncached_image_pull_it_once(worker, registry) -> None:
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: _predict(worker, "ten"), range(10)))
    assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers if a.status_code != 200]
    assert registry.blob_gets("models/sentiment-ten") == 6  # each of its six blobs once
    assert _metric(worker, "hotset_source_fetches_total", model="ten", result="download") == 1
