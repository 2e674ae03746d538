"""The torchvision worker classifies images sent as bytes (never paths) or as preprocessed tensors."""
from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker import engine
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "black": (0, 0, 0), "white": (255, 255, 255)}


def encoded(colour: tuple[int, int, int], size: tuple[int, int] = (90, 70), fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def classifier(sample_specs: dict[str, ModelSpec]) -> Iterator[FrameworkWorker]:
    worker = engine.create(sample_specs["colors"], WorkerContext())
    worker.load()
    yield worker
    worker.unload()


def copy_of_sample(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> Path:
    folder = tmp_path / "colors"
    shutil.copytree(Path(sample_specs["colors"].source.removeprefix("file://")), folder)
    return folder


def test_base64_images_are_classified_with_the_labels_of_model_json(classifier: FrameworkWorker) -> None:
    rows = classifier.predict([b64(encoded(rgb)) for rgb in COLOURS.values()])
    assert [row["label"] for row in rows] == list(COLOURS)
    for row in rows:
        assert list(row["probabilities"]) == list(COLOURS)
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)


def test_a_data_url_and_any_image_size_are_accepted(classifier: FrameworkWorker) -> None:
    url = "data:image/png;base64," + b64(encoded(COLOURS["blue"], size=(300, 20)))
    assert classifier.predict(url)[0]["label"] == "blue"


def test_a_preprocessed_tensor_gives_the_same_answer_as_the_image(classifier: FrameworkWorker) -> None:
    from_image = classifier.infer({"image": np.array([encoded(COLOURS["green"])], dtype=np.object_)}, {})
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]
    tensor = (np.broadcast_to(np.array([0.0, 1.0, 0.0], dtype=np.float32)[:, None, None], (3, 64, 64)) - mean) / std
    from_tensor = classifier.infer({"input": tensor[None].astype(np.float32)}, {})
    assert np.allclose(from_image["probabilities"], from_tensor["probabilities"], atol=1e-4)
    assert classifier.predict(tensor.tolist())[0]["label"] == "green"
    # Metadata lists the one canonical input; `image` is the extension infer takes instead of it.
    assert [(t.name, t.datatype, t.shape) for t in classifier.inputs()] == [("input", "FP32", [-1, 3, 64, 64])]


def test_both_inputs_at_once_are_bad_input_naming_the_alternatives(classifier: FrameworkWorker) -> None:
    both = {"input": np.zeros((1, 3, 64, 64), dtype=np.float32), "image": np.array([encoded(COLOURS["red"])], dtype=np.object_)}
    with pytest.raises(errors.BadInput, match="'input'.*instead the extension 'image'"):
        classifier.infer(both, {})


def test_undecodable_image_is_bad_input(classifier: FrameworkWorker) -> None:
    with pytest.raises(errors.BadInput, match="cannot decode image"):
        classifier.predict(b64(b"these bytes are no image at all"))
    with pytest.raises(errors.BadInput, match="cannot decode image"):
        classifier.predict(b64(encoded(COLOURS["red"])[:40]))  # truncated PNG


def test_text_that_is_not_base64_is_bad_input(classifier: FrameworkWorker) -> None:
    with pytest.raises(errors.BadInput, match="base64"):
        classifier.predict("/etc/passwd")  # a server-side path is never opened


@pytest.mark.parametrize("shape", [(3, 32, 32), (2, 1, 64, 64), (64, 64, 3)])
def test_wrong_tensor_shape_names_the_expected_shape(classifier: FrameworkWorker, shape: tuple[int, ...]) -> None:
    with pytest.raises(errors.BadInput, match=r"\[N, 3, 64, 64\]"):
        classifier.predict(np.zeros(shape).tolist())


def test_wrong_tensor_dtype_is_bad_input(classifier: FrameworkWorker) -> None:
    with pytest.raises(errors.BadInput, match="FP32"):
        classifier.infer({"input": np.zeros((1, 3, 64, 64), dtype=np.int32)}, {})


def test_missing_weights_fail_the_load_naming_the_file(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    folder = copy_of_sample(sample_specs, tmp_path)
    (folder / "weights.pt").unlink()
    spec = sample_specs["colors"].model_copy(update={"source": folder.as_uri()})
    with pytest.raises(errors.ModelLoadFailed, match="weights.pt is missing"):
        engine.create(spec, WorkerContext()).load()


def test_corrupt_weights_fail_the_load(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    folder = copy_of_sample(sample_specs, tmp_path)
    (folder / "weights.pt").write_bytes(b"\x00garbage")
    spec = sample_specs["colors"].model_copy(update={"source": folder.as_uri()})
    with pytest.raises(errors.ModelLoadFailed, match="cannot load .*weights.pt"):
        engine.create(spec, WorkerContext()).load()


def test_weights_of_another_architecture_fail_the_load(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    folder = copy_of_sample(sample_specs, tmp_path)
    description = json.loads((folder / "model.json").read_text())
    (folder / "model.json").write_text(json.dumps(dict(description, architecture="resnet18")))
    spec = sample_specs["colors"].model_copy(update={"source": folder.as_uri()})
    with pytest.raises(errors.ModelLoadFailed, match="state_dict"):
        engine.create(spec, WorkerContext()).load()


def test_invalid_model_json_fails_the_load(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    folder = copy_of_sample(sample_specs, tmp_path)
    (folder / "model.json").write_text("{not json")
    spec = sample_specs["colors"].model_copy(update={"source": folder.as_uri()})
    with pytest.raises(errors.ModelLoadFailed, match="model.json is not a valid model description"):
        engine.create(spec, WorkerContext()).load()


def test_a_decompression_bomb_is_refused_before_decoding(classifier: FrameworkWorker) -> None:
    bomb = encoded(COLOURS["white"], size=(8000, 8000))  # 64 Mpx, a few hundred KB as PNG
    assert len(bomb) < 1_000_000
    with pytest.raises(errors.BadInput, match="8000x8000 pixels exceeds the limit"):
        classifier.predict(b64(bomb))
