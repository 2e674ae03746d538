"""The standalone model store reads the seed's JSON shape, extended, and names what is wrong."""
from __future__ import annotations

import json

import pytest

from hotset_common import errors
from hotset_common.spec import Framework, Task
from hotset_worker.store import JsonModelStore


def write(path, models) -> None:
    path.write_text(json.dumps({"models": models}))


def test_the_seed_shape_with_extensions(tmp_path) -> None:
    (tmp_path / "sentiment").mkdir()
    write(
        tmp_path / "models.json",
        [
            {"id": "sentiment", "name": "Sentiment", "type": "text_classification", "framework": "transformers",
             "version": "2", "description": "d", "source": "file://sentiment", "memory": "600Mi", "pinned": True,
             "labels": {"team": "a"}},
            {"id": "resnet", "name": "ResNet", "type": "image-classification", "framework": "torchvision",
             "version": "1", "source": "file:///srv/models/resnet", "task": "embedding"},
            {"id": "simple", "name": "Simple", "type": "unknown-kind", "framework": "triton", "source": {"uri": "pvc://models/simple"}},
        ],
    )
    store = JsonModelStore(tmp_path / "models.json")
    sentiment, resnet, simple = store.get("sentiment"), store.get("resnet"), store.get("simple")
    assert store.ids() == ["resnet", "sentiment", "simple"]
    assert (sentiment.task, sentiment.version, sentiment.memory_bytes, sentiment.pinned) == (Task.TEXT_CLASSIFICATION, "2", 600 * 2**20, True)
    assert sentiment.source == f"file://{tmp_path / 'sentiment'}"  # relative to the store file
    assert sentiment.labels == {"team": "a"}
    assert resnet.task is Task.EMBEDDING  # an explicit task wins over the seed's type
    assert resnet.source == "file:///srv/models/resnet"
    assert (simple.framework, simple.task, simple.source) == (Framework.TRITON, Task.TENSOR, "pvc://models/simple")


def test_an_unknown_id_is_model_not_found(tmp_path) -> None:
    write(tmp_path / "models.json", [])
    with pytest.raises(errors.ModelNotFound, match="'ghost'"):
        JsonModelStore(tmp_path / "models.json").get("ghost")


@pytest.mark.parametrize(
    ("models", "problem"),
    [
        ([{"id": "x", "framework": "onnx", "source": "file:///m"}], "'x': framework"),
        ([{"id": "x", "framework": "triton"}], "'x': source"),
        ([{"id": "x", "framework": "triton", "source": "ftp://example/m"}], "scheme 'ftp'"),
        ([{"id": "x", "framework": "triton", "source": "file://../escape"}], "'..'"),
        ([{"id": "x", "framework": "triton", "source": "file:///m", "memory": "lots"}], "memory"),
        ([{"id": "x", "framework": "triton", "source": "file:///m"}] * 2, "'x' twice"),
    ],
)
def test_bad_entries_are_refused_naming_the_model_and_field(tmp_path, models, problem) -> None:
    write(tmp_path / "models.json", models)
    with pytest.raises(ValueError, match=problem):
        JsonModelStore(tmp_path / "models.json")


def test_a_file_that_is_not_a_store_says_so(tmp_path) -> None:
    (tmp_path / "models.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match='"models" list'):
        JsonModelStore(tmp_path / "models.json")
    with pytest.raises(ValueError, match="cannot read"):
        JsonModelStore(tmp_path / "absent.json")


def test_the_router_reads_a_store_file_exactly_as_the_worker_does(tmp_path) -> None:
    """One parser (hotset_common.model_store): the router used to skip entries the worker accepted."""
    from hotset_router.discovery import read_model_store

    (tmp_path / "local").mkdir()
    write(tmp_path / "models.json", [
        {"id": "seed-typed", "type": "text_classification", "framework": "transformers", "source": "file://local"},
        {"id": "canaried", "framework": "torchvision", "source": "local", "memory": "10Mi",
         "rollout": {"canary": {"version": "2", "source": "file://local", "weight": 10}}},
    ])
    worker = {spec.id: spec for spec in JsonModelStore(tmp_path / "models.json").list() if not spec.variant_of}
    router = read_model_store(tmp_path / "models.json")
    assert router == worker and sorted(router) == ["canaried", "seed-typed"]
    assert router["seed-typed"].task is Task.TEXT_CLASSIFICATION
    assert router["canaried"].rollout.canary.source == f"file://{tmp_path / 'local'}"
    write(tmp_path / "models.json", [{"id": "x", "framework": "onnx", "source": "file:///m"}])
    with pytest.raises(ValueError, match="'x': framework"):  # refused by both, naming the model and field
        read_model_store(tmp_path / "models.json")


def test_a_base_models_static_lora_adapters_are_models_of_the_store_that_go_with_it() -> None:
    """spec.loraAdapters: each adapter is a model of its own name (routed, loaded, reported), an
    adapter of its base that the base's engine starts with; a model of the store's own keeps its name."""
    from hotset_common.spec import ModelSpec
    from hotset_worker.store import MemoryModelStore

    base = ModelSpec(id="chat", framework="vllm", task="text-generation", source="file:///m/chat", memory="2Gi",
                     loraAdapters=[{"name": "chat-sql", "source": {"uri": "file:///m/sql"}},
                                   {"name": "mine", "source": "file:///m/mine"}])
    own = ModelSpec(id="mine", framework="transformers", source="file:///m/mine", memory="1Mi")
    store = MemoryModelStore([own, base])
    adapter = store.get("chat-sql")
    assert (adapter.base_model, adapter.static_adapter, adapter.source, adapter.memory_bytes) == \
        ("chat", True, "file:///m/sql", 0)
    assert store.get("mine").framework is Framework.TRANSFORMERS  # not replaced by the adapter of that name
    store.remove("chat")
    assert sorted(s.id for s in store.list()) == ["mine"]
    with pytest.raises(ValueError, match="loraAdapters"):
        ModelSpec(id="clf", framework="transformers", source="file:///m/c", loraAdapters=[{"name": "a", "source": "file:///a"}])
