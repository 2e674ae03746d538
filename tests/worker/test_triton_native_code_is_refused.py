"""A Triton model folder that would make the sidecar run native code, or read files outside the model,
is refused at load (403 naming the file and the rule) in cluster mode, whatever its files are called,
and the full pod keeps serving the model it holds: docs/security.md, "What cluster mode refuses".

One real tritonserver; the worker app is the real one (manager, API, Triton backend), under both
budget modes: a hard budget evicts before it loads, so the refusal must come before that.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from hotset_common.budget import BudgetMode
from hotset_common.spec import ModelSpec
from hotset_testing.worker_server import serve_in_thread

pytestmark = pytest.mark.triton

BUDGET = 2**30
ALLOWED = frozenset({"python", "onnxruntime"})
MACH_O_64 = b"\xcf\xfa\xed\xfe"

# name: (lines added to iris's config.pbtxt, files added to its folder, what the refusal must say)
HOSTILE: dict[str, tuple[str, dict[str, bytes], list[str]]] = {
    "custom-ops": ('model_operations { op_library_filename: "libcustom_ops.so" }', {},
                   ["config.pbtxt", "'libcustom_ops.so'", "model_operations"]),
    "elf-weights": ("", {"1/weights.bin": Path("/bin/true").read_bytes()}, ["1/weights.bin", "(ELF)"]),
    "mach-o": ("", {"1/weights.bin": MACH_O_64}, ["1/weights.bin", "(Mach-O)"]),
    "pe": ("", {"labels.dat": b"MZ\x90\x00"}, ["labels.dat", "(PE)"]),
    "named-so": ("", {"libtriton_python.so": b"not even ELF"}, ["libtriton_python.so", "shared library"]),
    "runtime": ('runtime: "weights.bin"', {}, ["config.pbtxt", "'weights.bin'", "runtime"]),
    "repository-agent": ('model_repository_agents { agents [ { name: "../../1/agent" } ] }', {},
                         ["config.pbtxt", "'../../1/agent'", "repository agent"]),
    "path-parameter": ('parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/opt/env.tar.gz" } }', {},
                       ["config.pbtxt", "'EXECUTION_ENV_PATH' = '/opt/env.tar.gz'", "path"]),
    "library-parameter": ('parameters { key: "MODEL_INIT_LIBRARY" value: { string_value: "init" } }', {},
                          ["config.pbtxt", "'MODEL_INIT_LIBRARY'", "load a library"]),
    "file-outside": ('default_model_filename: "../../../etc/passwd"', {},
                     ["config.pbtxt", "'../../../etc/passwd'", "outside the model's folder"]),
}


def hostile_folder(root: Path, iris: Path, name: str) -> Path:
    folder = root / name
    shutil.copytree(iris, folder)
    added, files, _ = HOSTILE[name]
    (folder / "config.pbtxt").write_text((iris / "config.pbtxt").read_text() + added + "\n")
    for relative, content in files.items():
        (folder / relative).write_bytes(content)
    return folder


@pytest.fixture(scope="module", params=[BudgetMode.LOAD_FIRST, BudgetMode.HARD], ids=lambda mode: mode.value)
def pod(request, sample_specs: dict[str, ModelSpec], tritonserver, tmp_path_factory) -> Iterator[httpx.Client]:
    """A cluster-mode worker whose budget iris fills as far as the hostile models go: each of them
    declares the whole budget, so admitting it promises iris away."""
    from hotset_worker import api, engine
    from hotset_worker.backends import Backends
    from hotset_worker.frameworks.base import WorkerContext
    from hotset_worker.manager import ModelManager
    from hotset_worker.metrics import WorkerMetrics
    from hotset_worker.store import MemoryModelStore
    from hotset_worker.triton_backend import TritonBackend

    iris = sample_specs["iris"]
    root = tmp_path_factory.mktemp("hostile")
    source = Path(iris.source.removeprefix("file://"))
    hostile = [iris.model_copy(update={"id": name, "source": f"file://{hostile_folder(root, source, name)}",
                                       "memory_bytes": BUDGET}) for name in HOSTILE]
    nested = root / "too-deep"
    shutil.copytree(source, nested)
    (nested / "1" / "loop").symlink_to(nested, target_is_directory=True)  # a link loop: endless unless bounded
    hostile.append(iris.model_copy(update={"id": "too-deep", "source": f"file://{nested}", "memory_bytes": BUDGET}))
    backends = Backends([TritonBackend(tritonserver.url, tritonserver.repository)])
    metrics = WorkerMetrics("p", BUDGET)
    context = WorkerContext(backends=backends.by_name(), triton_backends=ALLOWED)
    manager = ModelManager(MemoryModelStore([iris, *hostile]), context, BUDGET, observer=metrics,
                           preflight=backends.require, create_worker=engine.create, budget_mode=request.param)
    app = api.create_app(manager, metrics, backends, pod_name="p", load_pinned=False)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        loaded = client.post("/v2/repository/models/iris/load")
        assert loaded.status_code == 200, loaded.text
        yield client


def assert_iris_serves(pod: httpx.Client) -> None:
    assert list(pod.get("/models").json()["loaded_models"]) == ["iris"]
    answer = pod.post("/predict", json={"model_id": "iris", "input_data": [[5.1, 3.5, 1.4, 0.2]]})
    assert answer.status_code == 200, answer.text
    (probabilities,) = answer.json()["predictions"].values()
    assert np.allclose(np.sum(probabilities, axis=1), 1.0, atol=1e-4)


def test_a_clean_triton_model_loads_and_infers(pod: httpx.Client) -> None:
    assert_iris_serves(pod)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_folder_that_would_run_native_code_is_403_naming_the_file_and_iris_keeps_serving(
        pod: httpx.Client, tritonserver, name: str) -> None:
    answer = pod.post(f"/v2/repository/models/{name}/load")
    assert answer.status_code == 403, answer.text
    message = answer.json()["error"]
    for expected in HOSTILE[name][2]:
        assert expected in message, (expected, message)
    assert "trust policy" in message and len(message) < 400
    assert not (tritonserver.repository / name).exists()  # nothing reached Triton
    assert_iris_serves(pod)


def test_a_folder_past_the_scan_bound_is_403_and_iris_keeps_serving(pod: httpx.Client) -> None:
    answer = pod.post("/v2/repository/models/too-deep/load")
    assert answer.status_code == 403, answer.text
    assert "folders deep" in answer.json()["error"] and "refuses folders past" in answer.json()["error"]
    assert_iris_serves(pod)
