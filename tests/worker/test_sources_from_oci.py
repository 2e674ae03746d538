"""oci:// pulled by the worker (image volumes off) from a real registry (the distribution registry on loopback).

The real ``hotset-worker`` loads the sample sentiment model pushed with oras-py (the client it
pulls with) as an ORAS artifact, and as an OCI image whose one tar+gzip layer is built here. The
registry speaks plain http, allowed as the pool's policy would (``--oci-plain-http``). Blob GETs
are counted in the registry's access log: a cached image is never pulled again. A second real
registry asks for credentials (its htpasswd access controller), read from a
``.dockerconfigjson`` as the operator mounts a pull Secret's key; a TCP proxy standing in for a
bad network cuts one pull mid-layer.
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
from hotset_testing.cutting_proxy import CuttingProxy
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


@pytest.fixture(scope="module")
def locked(tmp_path_factory, sample_specs):
    """A registry that asks for credentials, the sample sentiment model pushed to it."""
    work = tmp_path_factory.mktemp("locked-registry")
    marked = work / "model"  # a marker of its own: the same files would be the open registry's cached digest
    marked.mkdir()
    for file in Path(sample_specs["sentiment"].source.removeprefix("file://")).iterdir():
        (marked / file.name).write_bytes(file.read_bytes())
    (marked / "VERSION").write_text("locked")
    with oci_registry.running(work, users={"puller": PASSWORD}) as server:
        server.push_folder("models/sentiment:v1", marked)
        yield server


@pytest.fixture(scope="module")
def cutting(registry, pushed):
    """The open registry behind a proxy that can cut a pull's connection mid-answer."""
    host, port = registry.host.rsplit(":", 1)
    with CuttingProxy(host, int(port)).running() as proxy:
        yield proxy


PASSWORD = "open-sesame"


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
    padded = work / "padded"  # 2 MiB more than the model (a file transformers never reads): a pull to cut
    padded.mkdir()
    for file in folder.iterdir():
        (padded / file.name).write_bytes(file.read_bytes())
    (padded / "padding.bin").write_bytes(b"\x00" * (2 * 2**20))
    registry.push_folder("models/sentiment-padded:v1", padded)
    return digests


def _entry(model_id: str, uri: str, **source: str) -> dict:
    return {"id": model_id, "framework": "transformers", "task": "text-classification", "memory": "200Mi",
            "source": {"uri": uri, **source}}


@pytest.fixture(scope="module")
def worker(registry, pushed, locked, cutting, tmp_path_factory):
    root = tmp_path_factory.mktemp("worker")
    host = registry.host
    credentials = locked.credential_files(root / "credentials", "regcred", "puller", PASSWORD)
    locked.credential_files(credentials, "wrong-regcred", "puller", "not-the-password")
    locked.credential_files(credentials, "elsewhere-regcred", "puller", PASSWORD, host="registry.example.com")
    through = f"127.0.0.1:{cutting.port}"
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
        _entry("locked", f"oci://{locked.host}/models/sentiment:v1", secretName="regcred"),
        _entry("locked-anonymous", f"oci://{locked.host}/models/sentiment:v1"),
        _entry("locked-wrong", f"oci://{locked.host}/models/sentiment:v1", secretName="wrong-regcred"),
        _entry("locked-elsewhere", f"oci://{locked.host}/models/sentiment:v1", secretName="elsewhere-regcred"),
        _entry("cut", f"oci://{through}/models/sentiment-padded:v1"),
    ]}))
    cache = root / "cache"
    args = ["--model-store", str(store), "--memory-budget", "2Gi", "--source-cache", str(cache),
            "--source-cache-bytes", "1Gi", "--oci-image-volumes", "off", "--source-credentials", str(credentials),
            "--oci-plain-http", f"{host},127.0.0.1:9,{locked.host},{through}",
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


def test_a_registry_asking_for_credentials_is_pulled_with_the_dockerconfigjson_of_its_secret(worker, locked) -> None:
    answer = _predict(worker, "locked")
    assert answer.status_code == 200, answer.text
    assert locked.blob_gets("models/sentiment") > 0  # really pulled from the registry that asks
    assert _metric(worker, "hotset_source_fetches_total", model="locked", result="download") == 1


@pytest.mark.parametrize(("model", "named"), [
    ("locked-anonymous", r"refused access \(401\): name a Secret \(source\.secretName\) holding a \.dockerconfigjson"),
    ("locked-wrong", r"refused access \(401\) with the credentials of Secret 'wrong-regcred'"),
    ("locked-elsewhere", r"refused access \(401\): the \.dockerconfigjson of Secret 'elsewhere-regcred' has no "
                         r"entry for registry 127\.0\.0\.1:\d+"),
])
def test_missing_or_wrong_credentials_fail_the_load_naming_the_image_and_the_401(worker, locked, model, named) -> None:
    assert _predict(worker, "by-tag").status_code == 200  # loaded beside the failure
    answer = _predict(worker, model)
    assert answer.status_code == 500, answer.text
    detail = answer.json()["detail"]
    assert f"oci://{locked.host}/models/sentiment:v1" in detail and re.search(named, detail), detail
    assert "by-tag" in worker.get("/models").json()["loaded_models"]  # nothing was evicted
    assert _leftovers(worker) == []  # and nothing half-pulled is left
    failed = [c for c in worker.get("/status").json()["models"] if c["id"] == model]
    assert failed and failed[0]["state"] == "FAILED" and re.search(named, failed[0]["reason"])


def test_an_interrupted_pull_fails_naming_the_layer_and_the_next_attempt_pulls_it_whole(worker, cutting) -> None:
    assert _predict(worker, "by-tag").status_code == 200
    cutting.cut_after(2**20)  # the pull's connection drops a MiB into the registry's answers: mid-padding
    answer = _predict(worker, "cut")
    assert answer.status_code == 500, answer.text
    detail = answer.json()["detail"]
    assert re.search(rf"oci://127\.0\.0\.1:{cutting.port}/models/sentiment-padded:v1.*layer sha256:[0-9a-f]{{64}} "
                     r"was interrupted after \d+ bytes .*nothing was kept", detail), detail
    assert cutting.cuts == 1
    assert _leftovers(worker) == []
    assert "by-tag" in worker.get("/models").json()["loaded_models"]
    again = _predict(worker, "cut")  # the next attempt starts clean (no back-off in this worker)
    assert again.status_code == 200, again.text
    assert _metric(worker, "hotset_source_fetches_total", model="cut", result="failure") == 1
    assert _metric(worker, "hotset_source_fetches_total", model="cut", result="download") == 1


def test_an_image_volume_not_mounted_or_empty_fails_naming_the_image_and_where_it_looked(tmp_path) -> None:
    """Image volumes on (the default): the worker reads the kubelet's mount and pulls nothing."""
    from hotset_common import errors, sources
    from hotset_common.spec import ModelSpec
    from hotset_worker.sources import oci
    from hotset_worker.sources.fetcher import SourceFetcher
    from hotset_worker.sources.plan import SourceSettings

    settings = SourceSettings(oci_root=tmp_path / "oci")
    fetcher = SourceFetcher(None, settings)  # no source cache: nothing could be pulled anyway
    spec = ModelSpec(id="iris", framework="transformers", source="oci://registry.example.com/models/iris:1")
    mount = oci.mount_path(sources.parse(spec.source), settings)
    with pytest.raises(errors.ModelLoadFailed, match=rf"oci://registry\.example\.com/models/iris:1.*image "
                       rf"registry\.example\.com/models/iris:1 is not mounted in this pod \(expected an image volume "
                       rf"at {re.escape(str(mount))}\)"):
        fetcher.folder(spec)
    mount.mkdir(parents=True)
    with pytest.raises(errors.ModelLoadFailed, match=rf"image registry\.example\.com/models/iris:1 mounted at "
                       rf"{re.escape(str(mount))} holds no files"):
        fetcher.folder(spec)
    (mount / "config.json").write_text("{}")
    assert fetcher.folder(spec) == mount and fetcher.cached(spec) == mount
