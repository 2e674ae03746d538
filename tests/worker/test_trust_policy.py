"""What a worker refuses in cluster mode (docs/security.md): callers without its API token,
``file://`` sources outside the declared folders, Triton backends not on the allowlist."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_testing.worker_server import ballast_app, serve_in_thread, worker_process

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    store = ballast.catalog(root / "allowed", {"a": {}})
    outside = ballast.write_model(tmp_path_factory.mktemp("elsewhere") / "b", MiB)
    store.put(ballast.make_spec("b", outside))
    # A link inside the allowed folder that leads out of it does not count as inside.
    (root / "allowed" / "link").symlink_to(outside)
    store.put(ballast.make_spec("linked", root / "allowed" / "link"))
    app = ballast_app(store, budget=8 * MiB, api_token=TOKEN, file_roots=(root / "allowed",))
    with serve_in_thread(app) as url:
        yield url


def test_without_the_token_only_probes_and_metrics_answer(locked) -> None:
    for method, path in [("POST", "/predict"), ("GET", "/status"), ("POST", "/v2/repository/models/a/load"),
                         ("POST", "/v2/repository/models/a/unload"), ("POST", "/v2/models/a/infer"), ("GET", "/models")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            answer = httpx.request(method, locked + path, headers=headers, json={"model_id": "a", "input_data": [1]})
            assert answer.status_code == 401, (path, headers, answer.text)
            assert "Bearer" in answer.json()["error"] and answer.headers["WWW-Authenticate"] == "Bearer"
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(locked + path).status_code == 200, path


def test_with_the_token_everything_answers(locked) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(locked + "/predict", headers=headers, json={"model_id": "a", "input_data": [1.0]})
    assert answer.status_code == 200, answer.text
    assert httpx.get(locked + "/status", headers=headers).status_code == 200


@pytest.mark.parametrize("model", ["b", "linked"])
def test_a_file_source_outside_the_declared_folders_is_403_and_nothing_loads(locked, model) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(locked + "/predict", headers=headers, json={"model_id": model, "input_data": [1.0]})
    assert answer.status_code == 403, answer.text
    assert "outside the folders" in answer.json()["error"]
    assert model not in httpx.get(locked + "/models", headers=headers).json()["loaded_models"]


def test_the_worker_command_takes_the_policy_from_its_environment(tmp_path: Path) -> None:
    """A real hotset-worker with the variables the operator sets refuses a token-less call
    and a file:// source outside HOTSET_FILE_ROOTS (here: none at all)."""
    store = tmp_path / "store.json"
    store.write_text('{"models": [{"id": "secret", "framework": "transformers", "task": "embedding", '
                     '"source": "file:///var/run/secrets"}]}')
    env = {"HOTSET_API_TOKEN": TOKEN, "HOTSET_FILE_ROOTS": "", "HOTSET_TRITON_BACKENDS": "onnxruntime"}
    with worker_process(["--model-store", str(store), "--memory-budget", "64Mi"], env=env) as url:
        assert httpx.post(url + "/v2/repository/models/secret/load").status_code == 401
        answer = httpx.post(url + "/v2/repository/models/secret/load", headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=60)  # the load first waits for torch's import (seconds on a busy machine)
        assert answer.status_code == 403, answer.text
        assert "none (use pvc:// sources)" in answer.json()["error"]


def test_a_vllm_source_outside_the_declared_folders_is_403_and_no_engine_starts(tmp_path: Path) -> None:
    """vLLM sources skipped the file:// restriction every other framework enforced: an engine could
    be pointed at any folder of the pod. The real worker command, with the engine command of the
    test's vLLM stand-in, which must never run here."""
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere" / "llm"
    for folder in (allowed / "llm", elsewhere):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    started = tmp_path / "engine-started"
    store = tmp_path / "store.json"
    store.write_text(json.dumps({"models": [
        {"id": "inside", "framework": "vllm", "task": "text-generation", "source": f"file://{allowed}/llm", "memory": "64Mi"},
        {"id": "outside", "framework": "vllm", "task": "text-generation", "source": f"file://{elsewhere}", "memory": "64Mi"},
    ]}))
    env = {"HOTSET_API_TOKEN": TOKEN, "HOTSET_FILE_ROOTS": str(allowed)}
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--vllm-device-memory", "1Gi",
            "--vllm-command", f"touch {started}"]
    with worker_process(args, env=env) as url:
        answer = httpx.post(url + "/v2/repository/models/outside/load", headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=60)
        assert answer.status_code == 403, answer.text
        assert "outside the folders" in answer.json()["error"] and str(allowed) in answer.json()["error"]
    assert not started.exists(), "an engine was started for a source outside the declared folders"


@pytest.mark.triton
def test_a_triton_backend_not_on_the_allowlist_is_403(sample_specs: dict[str, ModelSpec], tritonserver, tmp_path: Path) -> None:
    """The sample iris model runs on Triton's Python backend (its own model.py): code execution."""
    from hotset_worker import engine
    from hotset_worker.backends import Backends
    from hotset_worker.frameworks.base import WorkerContext
    from hotset_worker.manager import ModelManager
    from hotset_worker.metrics import WorkerMetrics
    from hotset_worker import api
    from hotset_worker.store import MemoryModelStore
    from hotset_worker.triton_backend import TritonBackend

    folder = tmp_path / "iris"
    shutil.copytree(Path(sample_specs["iris"].source.removeprefix("file://")), folder)
    (folder / "1" / "libtriton_custom.so").write_bytes(b"\x7fELF")
    store = MemoryModelStore([sample_specs["iris"], sample_specs["iris"].model_copy(update={"id": "lib", "source": f"file://{folder}"})])
    backends = Backends([TritonBackend(tritonserver.url, tmp_path / "repository")])
    metrics = WorkerMetrics("p", 2**30)

    def app(allowed: frozenset[str]):
        context = WorkerContext(backends=backends.by_name(), triton_backends=allowed)
        manager = ModelManager(store, context, 2**30, observer=metrics, preflight=backends.require, create_worker=engine.create)
        return api.create_app(manager, metrics, backends, pod_name="p", load_pinned=False)

    with serve_in_thread(app(frozenset({"onnxruntime"}))) as url:
        answer = httpx.post(url + "/v2/repository/models/iris/load", timeout=60)
        assert answer.status_code == 403, answer.text
        assert "'python' is not allowed" in answer.json()["error"] and "onnxruntime" in answer.json()["error"]
    with serve_in_thread(app(frozenset({"python"}))) as url:
        answer = httpx.post(url + "/v2/repository/models/lib/load", timeout=60)
        assert answer.status_code == 403, answer.text
        assert "1/libtriton_custom.so is named as a shared library" in answer.json()["error"]
