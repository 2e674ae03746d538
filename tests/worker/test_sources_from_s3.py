"""s3:// (and gs:// through its S3 interoperability API) against a real S3 server (MinIO on loopback).

The real ``hotset-worker`` loads the sample sentiment model from a bucket, with credentials from
files laid out as the operator's credentials Secret mounts them; models are uploaded with boto3.
Each bad input is a load failure naming the URI, the object or the check; it evicts nothing and
leaves no partial file; a second load of an evicted model reads the cache.
"""
from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import httpx
import pytest

from hotset_testing.worker_server import wait_until, worker_process

pytestmark = pytest.mark.slow

SECRET = "minio-keys"


@pytest.fixture(scope="module")
def uploaded(s3, sample_specs):
    folder = Path(sample_specs["sentiment"].source.removeprefix("file://"))
    s3.make_bucket("models")
    s3.make_bucket("public-models", public=True)
    s3.upload_folder("models", "sentiment/v1/", folder)
    # The same model under other prefixes, each with a marker of its own: the cache is keyed by
    # content (object names, ETags, sizes), so identical copies would share one entry.
    for version in ("v2", "v3"):
        s3.upload_folder("models", f"sentiment/{version}/", folder)
        s3.client().put_object(Bucket="models", Key=f"sentiment/{version}/VERSION", Body=version.encode())
    s3.upload_folder("public-models", "sentiment/", folder)
    s3.upload_folder("models", "no-config/", folder)
    s3.client().delete_object(Bucket="models", Key="no-config/config.json")
    return folder


def _entry(model_id: str, uri: str, **source: object) -> dict:
    return {"id": model_id, "framework": "transformers", "task": "text-classification", "memory": "200Mi",
            "source": {"uri": uri, **source}}


@pytest.fixture(scope="module")
def worker(s3, uploaded, tmp_path_factory):
    root = tmp_path_factory.mktemp("worker")
    credentials = s3.credential_files(root / "credentials", SECRET)
    (credentials / "wrong-keys.AWS_ACCESS_KEY_ID").write_text("nobody")
    (credentials / "wrong-keys.AWS_SECRET_ACCESS_KEY").write_text("not-the-secret")
    store = root / "models.json"
    store.write_text(json.dumps({"models": [
        _entry("sentiment", "s3://models/sentiment/v1", secretName=SECRET),
        _entry("sentiment-ten", "s3://models/sentiment/v2", secretName=SECRET),
        _entry("sentiment-evict", "s3://models/sentiment/v3", secretName=SECRET),
        _entry("public", "s3://public-models/sentiment"),  # anonymous, unsigned
        _entry("through-gs", "gs://models/sentiment/v1", secretName=SECRET, endpoint=s3.endpoint),
        _entry("no-bucket", "s3://missing-bucket/sentiment", secretName=SECRET),
        _entry("no-key", "s3://models/nothing-here", secretName=SECRET),
        _entry("bad-keys", "s3://models/sentiment/v1", secretName="wrong-keys"),
        _entry("no-secret", "s3://models/sentiment/v1", secretName="never-made"),
        _entry("incomplete", "s3://models/no-config", secretName=SECRET),
    ]}))
    cache = root / "cache"
    args = ["--model-store", str(store), "--memory-budget", "2Gi", "--source-cache", str(cache),
            "--source-cache-bytes", "1Gi", "--source-credentials", str(credentials), "--s3-endpoint", s3.endpoint,
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
        if not line.startswith(name + "{"):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _partial_files(worker: httpx.Client) -> list[Path]:
    return [p for p in (worker.cache / "tmp").iterdir()]  # type: ignore[attr-defined]


def test_a_model_from_a_bucket_serves_and_its_second_load_reads_the_cache(worker) -> None:
    answer = _predict(worker, "sentiment")
    assert answer.status_code == 200, answer.text
    assert _metric(worker, "hotset_source_fetches_total", model="sentiment", result="download") == 1
    assert _metric(worker, "hotset_source_download_bytes_total", model="sentiment") > 1000
    assert worker.post("/v2/repository/models/sentiment/unload").status_code == 200
    again = _predict(worker, "sentiment")
    assert again.status_code == 200 and again.json()["predictions"] == answer.json()["predictions"]
    assert _metric(worker, "hotset_source_cache_hits_total", model="sentiment", scheme="s3") == 1
    assert _metric(worker, "hotset_source_fetches_total", model="sentiment", result="download") == 1  # not again


def test_a_public_bucket_is_read_unsigned_and_gs_goes_through_the_s3_api(worker) -> None:
    assert _predict(worker, "public").status_code == 200
    answer = _predict(worker, "through-gs")  # the bucket through the endpoint its source names
    assert answer.status_code == 200, answer.text
    assert _metric(worker, "hotset_source_fetches_total", model="through-gs", scheme="gs", result="download") == 1


@pytest.mark.parametrize(("model", "named"), [
    ("no-bucket", r"s3://missing-bucket/sentiment.*bucket does not exist"),
    ("no-key", r"s3://models/nothing-here.*no objects under s3 prefix 'nothing-here/'"),
    ("bad-keys", r"s3://models/sentiment/v1.*refused \((403|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied)"),
    ("no-secret", r"Secret 'never-made' \(source.secretName\)"),
    ("incomplete", r"s3://models/no-config.*config.json|config.json.*s3://models/no-config"),
])
def test_bad_sources_fail_the_load_naming_the_problem_evicting_nothing(worker, model, named) -> None:
    assert _predict(worker, "sentiment").status_code == 200  # loaded beside the failure
    answer = _predict(worker, model)
    assert answer.status_code == 500, answer.text
    assert re.search(named, answer.json()["detail"]), answer.json()["detail"]
    assert "sentiment" in worker.get("/models").json()["loaded_models"]  # nothing was evicted
    assert _partial_files(worker) == []  # and nothing half-downloaded is left
    failed = [c for c in worker.get("/status").json()["models"] if c["id"] == model]
    assert failed and failed[0]["state"] == "FAILED" and re.search(named, failed[0]["reason"])


def test_ten_concurrent_requests_for_an_uncached_model_download_it_once(worker) -> None:
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: _predict(worker, "sentiment-ten"), range(10)))
    assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers if a.status_code != 200]
    assert _metric(worker, "hotset_source_fetches_total", model="sentiment-ten", result="download") == 1
    assert _metric(worker, "hotset_source_fetches_total", model="sentiment-ten") == 1


def test_an_evicted_cache_entry_is_downloaded_again_and_an_entry_in_use_never_goes(worker) -> None:
    from hotset_worker.sources.cache import ContentCache

    assert _predict(worker, "sentiment-evict").status_code == 200
    loaded = {"sentiment", "sentiment-ten", "sentiment-evict", "public", "through-gs"}  # five contents
    assert loaded <= set(worker.get("/models").json()["loaded_models"])

    def entries() -> set[str]:
        return {p.name for p in (worker.cache / "entries").iterdir() if p.is_dir()}  # type: ignore[attr-defined]

    # Another process on the node evicting everything it may: only entries no copy holds go (here
    # the files of the model that failed to load for its missing config.json).
    cache = ContentCache(worker.cache, budget_bytes=1)  # type: ignore[attr-defined]
    cache.evict_unused()
    assert len(entries()) == len(loaded)
    # Unloaded, its lease goes (within the fetcher's sweep), and then it can be evicted.
    assert worker.post("/v2/repository/models/sentiment-evict/unload").status_code == 200
    wait_until(lambda: cache.evict_unused() > 0, timeout_s=30, what="the unloaded model's entry to be released")
    assert len(entries()) == len(loaded) - 1
    downloads = _metric(worker, "hotset_source_fetches_total", model="sentiment-evict", result="download")
    assert _predict(worker, "sentiment-evict").status_code == 200
    assert _metric(worker, "hotset_source_fetches_total", model="sentiment-evict", result="download") == downloads + 1
