"""A load sent before start-up preparation finished waits for it instead of failing.

The worker imports its store's frameworks on a thread at start-up. A load
that imported transformers at the same moment used to fail with
``ImportError: cannot import name 'AutoModel'``. The store here is the sample
store's transformers models only, so preparation starts with the
transformers import right when the worker starts listening: the requests
below land in the middle of it every time.
"""
from __future__ import annotations

import concurrent.futures
import json

import httpx

from hotset_testing.worker_server import worker_process


def test_loads_and_predicts_sent_while_preparing_succeed(sample_store, tmp_path) -> None:
    catalog = json.loads(sample_store.read_text())
    catalog["models"] = [m for m in catalog["models"] if m["framework"] == "transformers"]
    assert {"sentiment", "mini-embed"} <= {m["id"] for m in catalog["models"]}
    store = tmp_path / "model-store.json"
    store.write_text(json.dumps(catalog))

    with worker_process(["--model-store", str(store), "--memory-budget", "1Gi"]) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        before = client.get("/v2/health/ready")
        assert before.status_code == 503 and before.json()["prepared"] is False  # still importing
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            load = pool.submit(client.post, "/v2/repository/models/mini-embed/load")
            predict = pool.submit(client.post, "/predict", json={"model_id": "sentiment", "input_data": "what a great movie"})
            loaded, predicted = load.result(), predict.result()

        assert loaded.status_code == 200, loaded.text
        assert predicted.status_code == 200, predicted.text
        (prediction,) = predicted.json()["predictions"]
        assert prediction["label"] == "positive"
        assert list(client.get("/models").json()["loaded_models"]) == ["mini-embed", "sentiment"]
        assert client.get("/v2/health/ready").json()["prepared"] is True
