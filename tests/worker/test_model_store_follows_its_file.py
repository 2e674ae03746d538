"""A worker's model store follows its file: a mounted ConfigMap gains models after the pod started.

The operator publishes the catalog as a ConfigMap that every worker pod mounts;
the kubelet swaps the file when a ServedModel is added. Found by the e2e tier:
a shared pool pod started before any ServedModel must still serve them.
"""
from __future__ import annotations

import json
import os

import pytest

from hotset_common import errors
from hotset_worker.store import JsonModelStore


def replace(path, models) -> None:
    """Write the store the way the kubelet updates a ConfigMap volume: a new file renamed into place."""
    staging = path.with_name(".staging.json")
    staging.write_text(json.dumps({"models": models}) if isinstance(models, list) else models)
    os.replace(staging, path)


def entry(model_id: str) -> dict:
    return {"id": model_id, "framework": "transformers", "source": f"file:///srv/models/{model_id}"}


def test_models_added_to_the_file_become_known(tmp_path) -> None:
    path = tmp_path / "models.json"
    replace(path, [])
    store = JsonModelStore(path)
    with pytest.raises(errors.ModelNotFound):
        store.get("sentiment")
    replace(path, [entry("sentiment"), entry("colors")])
    assert store.get("sentiment").id == "sentiment"
    assert store.ids() == ["colors", "sentiment"]
    replace(path, [entry("colors")])
    assert store.ids() == ["colors"]


def test_a_broken_rewrite_keeps_the_previous_catalog(tmp_path) -> None:
    path = tmp_path / "models.json"
    replace(path, [entry("sentiment")])
    store = JsonModelStore(path)
    replace(path, "{not json")
    assert store.ids() == ["sentiment"]
    replace(path, [entry("iris")])
    assert store.ids() == ["iris"]
