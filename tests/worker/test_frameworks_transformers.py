"""The transformers worker serves the sample text classifier and encoder from their saved files."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker import engine
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext


@pytest.fixture(scope="module")
def classifier(sample_specs: dict[str, ModelSpec]) -> Iterator[FrameworkWorker]:
    worker = engine.create(sample_specs["sentiment"], WorkerContext())
    worker.load()
    yield worker
    worker.unload()


@pytest.fixture(scope="module")
def encoder(sample_specs: dict[str, ModelSpec]) -> Iterator[FrameworkWorker]:
    worker = engine.create(sample_specs["mini-embed"], WorkerContext())
    worker.load()
    yield worker
    worker.unload()


def test_classifier_names_labels_from_its_config_and_probabilities_sum_to_one(classifier: FrameworkWorker) -> None:
    rows = classifier.predict(["what a great movie", "the food was awful"])
    assert [row["label"] for row in rows] == ["positive", "negative"]
    for row in rows:
        assert set(row["probabilities"]) == {"negative", "positive"}
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
        assert row["score"] == max(row["probabilities"].values())


def test_a_single_string_is_one_prediction(classifier: FrameworkWorker) -> None:
    assert len(classifier.predict("i love this book")) == 1


def test_oip_infer_takes_bytes_text_and_returns_probabilities(classifier: FrameworkWorker) -> None:
    texts = np.array([b"a wonderful story", "the worst film".encode()], dtype=np.object_)
    outputs = classifier.infer({"text": texts}, {})
    assert list(outputs) == ["probabilities"]
    probabilities = outputs["probabilities"]
    assert probabilities.dtype == np.float32 and probabilities.shape == (2, 2)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert list(probabilities.argmax(axis=1)) == [1, 0]  # positive, negative (config.id2label order)
    assert [t.name for t in classifier.outputs()] == ["probabilities"] and classifier.outputs()[0].shape == [-1, 2]


@pytest.mark.parametrize("bad", [42, {"text": "x"}, [1, 2], [], None])
def test_non_text_input_is_bad_input(classifier: FrameworkWorker, bad: object) -> None:
    with pytest.raises(errors.BadInput):
        classifier.predict(bad)


def test_infer_with_a_wrong_tensor_name_names_the_expected_one(classifier: FrameworkWorker) -> None:
    with pytest.raises(errors.BadInput, match="'text'"):
        classifier.infer({"INPUT0": np.array([b"x"], dtype=np.object_)}, {})


def test_embeddings_are_normalised_and_reproducible(encoder: FrameworkWorker) -> None:
    rows = encoder.predict(["hello there", "a much longer sentence about a film and its music"])
    vectors = np.array([row["embedding"] for row in rows])
    assert vectors.shape == (2, 32)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    again = np.array([row["embedding"] for row in encoder.predict(["hello there"])])
    assert np.allclose(again[0], vectors[0], atol=1e-5)  # padding in a batch does not change the pooled vector
    assert not np.allclose(vectors[0], vectors[1])
    outputs = encoder.infer({"text": np.array([b"hello there"], dtype=np.object_)}, {})
    assert outputs["embedding"].shape == (1, 32)


def test_unload_frees_the_model(sample_specs: dict[str, ModelSpec]) -> None:
    worker = engine.create(sample_specs["sentiment"], WorkerContext())
    worker.load()
    assert worker.is_ready() and worker.measured_bytes() > 0
    worker.unload()
    assert not worker.is_ready()
    with pytest.raises(errors.HotsetError):
        worker.predict("still there?")


def test_missing_folder_fails_the_load_naming_the_path(tmp_path: Path) -> None:
    spec = ModelSpec(id="ghost", framework="transformers", task="text-classification", source=f"file://{tmp_path}/ghost")
    with pytest.raises(errors.ModelLoadFailed, match="ghost"):
        engine.create(spec, WorkerContext()).load()


def test_corrupt_weights_fail_the_load_with_a_clear_error(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(Path(sample_specs["sentiment"].source.removeprefix("file://")), folder)
    (folder / "model.safetensors").write_bytes(b"this is not a safetensors file")
    spec = ModelSpec(id="broken", framework="transformers", task="text-classification", source=folder.as_uri())
    with pytest.raises(errors.ModelLoadFailed, match="transformers could not load"):
        engine.create(spec, WorkerContext()).load()


def test_an_unsupported_task_is_refused_at_load(sample_specs: dict[str, ModelSpec]) -> None:
    spec = sample_specs["sentiment"].model_copy(update={"task": "image-classification"})
    with pytest.raises(errors.ModelLoadFailed, match="text-classification, embedding"):
        engine.create(spec, WorkerContext()).load()


def test_a_text_longer_than_the_model_is_truncated_not_an_error(
        sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    """A tokenizer saved without model_max_length must not let a long text overrun the positions."""
    import json

    folder = tmp_path / "no-max-length"
    shutil.copytree(Path(sample_specs["sentiment"].source.removeprefix("file://")), folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["model_max_length"]
    config_path.write_text(json.dumps(config))
    worker = engine.create(sample_specs["sentiment"].model_copy(update={"source": folder.as_uri()}), WorkerContext())
    worker.load()
    try:
        assert worker.predict(["great " * 1000])[0]["label"] == "positive"  # 1000 tokens, 128 positions
    finally:
        worker.unload()


def test_loads_on_two_threads_at_once_never_break_later_loads(sample_specs: dict[str, ModelSpec]) -> None:
    """transformers' from_pretrained patches process-wide objects while it builds a model; two at
    once left PreTrainedModel.tie_weights patched for good, and every later load of tiny-chat (tied
    weights) failed with "Cannot copy out of meta tensor" (1 in 6 rounds before the fix). The
    manager loads on two threads, so a chat request's load could meet any other model's."""
    import concurrent.futures

    from transformers import PreTrainedModel

    original = PreTrainedModel.tie_weights

    def load_and_unload(model: str) -> None:
        worker = engine.create(sample_specs[model], WorkerContext())
        worker.load()
        worker.unload()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(6):
            list(pool.map(load_and_unload, ["tiny-chat", "mini-embed"]))  # raises a failed load's error
    assert PreTrainedModel.tie_weights is original
    load_and_unload("tiny-chat")
