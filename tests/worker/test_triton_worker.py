"""The triton worker drives a real tritonserver: stage, load, infer by metadata, unload."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing.triton import TritonServer, free_ports
from hotset_worker import engine
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext
from hotset_worker.triton_backend import TritonBackend

SETOSA = [5.0, 3.4, 1.5, 0.2]
VIRGINICA = [6.6, 3.0, 5.6, 2.0]


def context_for(backend: TritonBackend) -> WorkerContext:
    return WorkerContext(backends={backend.name: backend})


def repository_index(server: TritonServer) -> dict[str, dict]:
    response = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=10)
    response.raise_for_status()
    return {entry["name"]: entry for entry in response.json()}


def iris_copy(sample_specs: dict[str, ModelSpec], tmp_path: Path, model_id: str) -> tuple[Path, ModelSpec]:
    folder = tmp_path / model_id
    shutil.copytree(Path(sample_specs["iris"].source.removeprefix("file://")), folder)
    return folder, sample_specs["iris"].model_copy(update={"id": model_id, "name": model_id, "source": folder.as_uri()})


@pytest.fixture(scope="module")
def iris(sample_specs: dict[str, ModelSpec], triton_backend: TritonBackend,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrameworkWorker]:
    """The iris sample, loaded once for the module under its own id."""
    _, spec = iris_copy(sample_specs, tmp_path_factory.mktemp("iris"), "iris-shared")
    worker = engine.create(spec, context_for(triton_backend))
    worker.load()
    try:
        yield worker
    finally:
        worker.unload()


def test_load_infer_unload_with_names_from_the_models_metadata(
        sample_specs: dict[str, ModelSpec], tritonserver: TritonServer, triton_backend: TritonBackend) -> None:
    worker = engine.create(sample_specs["iris"], context_for(triton_backend))
    worker.load()
    try:
        assert worker.is_ready()
        assert [(t.name, t.datatype, t.shape) for t in worker.inputs()] == [("measurements", "FP32", [-1, 4])]
        assert [(t.name, t.datatype, t.shape) for t in worker.outputs()] == [("species_probabilities", "FP32", [-1, 3])]
        assert repository_index(tritonserver)["iris"]["state"] == "READY"
        # Its stub process is visible here, so the size is measured, not the spec's 64 MiB estimate.
        assert 5 * 2**20 < worker.measured_bytes() < 1024 * 2**20
        assert worker.measured_bytes() != sample_specs["iris"].memory_bytes
        outputs = worker.infer({"measurements": np.array([SETOSA, VIRGINICA], dtype=np.float32)}, {})
        probabilities = outputs["species_probabilities"]
        assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        assert list(probabilities.argmax(axis=1)) == [0, 2]  # setosa, virginica
    finally:
        worker.unload()
    assert not worker.is_ready()
    assert repository_index(tritonserver).get("iris", {}).get("state") != "READY"
    assert not (tritonserver.repository / "iris").exists()  # the staged copy is removed


def test_seed_predict_takes_one_example_or_a_batch(iris: FrameworkWorker) -> None:
    one = iris.predict(SETOSA)
    assert list(one) == ["species_probabilities"] and len(one["species_probabilities"]) == 1
    batch = iris.predict({"measurements": [SETOSA, VIRGINICA, SETOSA]})
    assert [max(range(3), key=row.__getitem__) for row in batch["species_probabilities"]] == [0, 2, 0]


def test_integer_measurements_are_cast_to_the_models_datatype(iris: FrameworkWorker) -> None:
    outputs = iris.infer({"measurements": np.array([[5, 3, 1, 0]], dtype=np.int64)}, {})
    assert outputs["species_probabilities"].argmax() == 0


@pytest.mark.parametrize("bad, match", [
    ({"measurements": np.zeros((2, 5), dtype=np.float32)}, r"shape \[-1, 4\]"),
    ({"wrong": np.zeros((1, 4), dtype=np.float32)}, "missing \\['measurements'\\]"),
    ({"measurements": np.array([[b"a", b"b", b"c", b"d"]], dtype=np.object_)}, "must be FP32"),
])
def test_bad_tensors_are_bad_input_naming_the_problem(iris: FrameworkWorker, bad: dict, match: str) -> None:
    with pytest.raises(errors.BadInput, match=match):
        iris.infer(bad, {})


def test_a_model_is_served_under_its_id_whatever_its_config_calls_it(
        sample_specs: dict[str, ModelSpec], tritonserver: TritonServer, triton_backend: TritonBackend,
        tmp_path: Path) -> None:
    _, spec = iris_copy(sample_specs, tmp_path, "flowers")
    worker = engine.create(spec, context_for(triton_backend))
    worker.load()
    try:
        assert repository_index(tritonserver)["flowers"]["state"] == "READY"
        assert worker.predict(VIRGINICA)["species_probabilities"][0][2] > 0.5
    finally:
        worker.unload()


def test_a_model_without_its_code_fails_with_tritons_reason(
        sample_specs: dict[str, ModelSpec], tritonserver: TritonServer, triton_backend: TritonBackend,
        tmp_path: Path) -> None:
    folder, spec = iris_copy(sample_specs, tmp_path, "iris-no-code")
    (folder / "1" / "model.py").unlink()
    worker = engine.create(spec, context_for(triton_backend))
    with pytest.raises(errors.ModelLoadFailed, match=r"model file .*iris-no-code/1/model.py is missing"):
        worker.load()
    assert not (tritonserver.repository / "iris-no-code").exists()


def test_a_corrupt_config_fails_the_load(
        sample_specs: dict[str, ModelSpec], tritonserver: TritonServer, triton_backend: TritonBackend,
        tmp_path: Path) -> None:
    folder, spec = iris_copy(sample_specs, tmp_path, "iris-bad-config")
    (folder / "config.pbtxt").write_text("backend: \"python\"\ninput [ { name: \"x\" data_type: NOT_A_TYPE } ]\n")
    with pytest.raises(errors.ModelLoadFailed, match="Triton refused model 'iris-bad-config'"):
        engine.create(spec, context_for(triton_backend)).load()


def test_a_missing_source_fails_before_triton_is_asked(triton_backend: TritonBackend, tmp_path: Path) -> None:
    spec = ModelSpec(id="nowhere", framework="triton", source=f"file://{tmp_path}/nowhere")
    with pytest.raises(errors.ModelLoadFailed, match="nowhere"):
        engine.create(spec, context_for(triton_backend)).load()


def test_a_sidecar_that_is_down_is_backend_unavailable(sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    (port,) = free_ports(1)  # nothing listens here
    nobody = TritonBackend(f"127.0.0.1:{port}", tmp_path / "repo")
    worker = engine.create(sample_specs["iris"], context_for(nobody))
    try:
        with pytest.raises(errors.BackendUnavailable, match=f"127.0.0.1:{port}") as caught:
            worker.load()
        assert caught.value.status_code == 503
        assert not worker.is_ready()
        assert not (tmp_path / "repo" / "iris").exists()
    finally:
        nobody.close()


def test_a_sidecar_that_dies_after_the_load_makes_inference_unavailable(
        sample_specs: dict[str, ModelSpec], tmp_path: Path) -> None:
    from hotset_testing.triton import start_tritonserver

    server = start_tritonserver(tmp_path / "repo", log_dir=tmp_path)
    own = TritonBackend(server.url, server.repository)
    try:
        try:
            worker = engine.create(sample_specs["iris"], context_for(own))
            worker.load()
            assert worker.predict(SETOSA)["species_probabilities"][0][0] > 0.5
        finally:
            server.stop()
        assert not worker.is_ready()
        with pytest.raises(errors.BackendUnavailable, match="unavailable"):
            worker.predict(SETOSA)
        worker.unload()  # an unload with the sidecar gone still cleans up and does not raise
        assert not (tmp_path / "repo" / "iris").exists()
    finally:
        own.close()


def test_concurrent_requests_from_many_threads_all_get_their_own_answer(iris: FrameworkWorker) -> None:
    """The worker serves from a thread pool; every thread's call goes through the one backend client."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [SETOSA if i % 2 == 0 else VIRGINICA for i in range(40)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda row: iris.predict(row)["species_probabilities"][0], inputs))
    assert [max(range(3), key=p.__getitem__) for p in answers] == [0 if i % 2 == 0 else 2 for i in range(40)]
