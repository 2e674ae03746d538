"""A triton model from s3:// is read by a real tritonserver from the source cache, in place: the
repository holds its renamed config and links, never a copy of its files."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from hotset_testing.worker_server import wait_until, worker_process

pytestmark = [pytest.mark.slow, pytest.mark.triton]


def test_a_cached_triton_model_is_linked_into_the_repository_not_copied(s3, sample_specs, tritonserver, tmp_path) -> None:
    from pathlib import Path

    s3.make_bucket("triton-models", public=True)
    s3.upload_folder("triton-models", "iris/", Path(sample_specs["iris"].source.removeprefix("file://")))
    store = tmp_path / "models.json"
    store.write_text(json.dumps({"models": [{"id": "iris-s3", "framework": "triton", "source": "s3://triton-models/iris"}]}))
    cache = tmp_path / "cache"
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--triton-url", tritonserver.url,
            "--triton-repository", str(tritonserver.repository), "--source-cache", str(cache),
            "--s3-endpoint", s3.endpoint]
    with worker_process(args, timeout_s=120) as url, httpx.Client(base_url=url, timeout=120) as worker:
        wait_until(lambda: worker.get("/v2/health/ready").status_code == 200, timeout_s=60, what="worker readiness")
        answer = worker.post("/predict", json={"model_id": "iris-s3", "input_data": [[5.1, 3.5, 1.4, 0.2]]})
        assert answer.status_code == 200, answer.text
        (probabilities,) = answer.json()["predictions"].values()
        assert abs(float(np.sum(probabilities)) - 1.0) < 1e-4
        staged = tritonserver.repository / "iris-s3"
        assert (staged / "config.pbtxt").is_file() and not (staged / "config.pbtxt").is_symlink()
        assert 'name: "iris-s3"' in (staged / "config.pbtxt").read_text()  # renamed to its id
        assert (staged / "1").is_symlink() and cache in (staged / "1").resolve().parents
        own = [child.name for child in staged.iterdir() if child.name != "config.pbtxt" and not child.is_symlink()]
        assert own == []  # nothing but the config is the repository's own: the rest links into the cache
        assert worker.post("/v2/repository/models/iris-s3/unload").status_code == 200
        assert not staged.exists()
        assert any((cache / "entries").iterdir())  # the cache keeps the files for the next load
