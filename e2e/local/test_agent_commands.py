"""How the node agent turns a container spec into a local command line (no cluster needed).

These rules decide whether the chart's pod specs start at all on the local
tier, so each is pinned here with the spec shapes the chart and operator use.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodeagent.commands import (PodRewriter, UnmappedImage, container_argv, expand_vars, resolve_argv,
                                with_bind_host)

VENV = Path(sys.executable).parent  # where the modelplane entry points are installed
POD_IP = "127.11.1.2"


def test_tritonserver_command_runs_the_launcher_with_its_flags_translated() -> None:
    sidecar = {"name": "triton", "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
               "command": ["tritonserver", "--model-control-mode=explicit", "--model-repository=/models",
                           "--http-address=127.0.0.1", "--http-port=8000", "--grpc-port=8001",
                           "--strict-readiness=false", "--log-verbose=1"]}
    rewrite = PodRewriter(POD_IP, {"/models": Path("/state/pod/volumes/model-repository")})
    argv = with_bind_host([rewrite(a) for a in resolve_argv(sidecar, VENV)], POD_IP)
    assert argv == [str(VENV / "modelplane-triton"), "--model-repository", "/state/pod/volumes/model-repository",
                    "--host", POD_IP, "--http-port", "8000", "--grpc-port", "8001", "--", "--log-verbose=1"]


@pytest.mark.parametrize(("container", "program"), [
    ({"image": "ghcr.io/modelplane/worker:0.1.0", "command": ["modelplane-worker"]}, "modelplane-worker"),
    ({"image": "registry/modelplane-router:dev"}, "modelplane-router"),
    ({"image": "modelplane-operator:e2e"}, "modelplane-operator"),
    ({"image": "python:3.11", "command": ["python3", "-m", "http.server"]}, "python"),
])
def test_images_and_commands_map_to_local_programs(container: dict, program: str) -> None:
    assert resolve_argv(container, VENV)[0] == str(VENV / program)


def test_an_image_without_a_local_entry_point_is_refused_by_name() -> None:
    with pytest.raises(UnmappedImage, match="busybox"):
        resolve_argv({"image": "busybox:1.36"}, VENV)


def test_this_pod_means_its_own_address_and_its_own_volumes() -> None:
    rewrite = PodRewriter(POD_IP, {"/models": Path("/v/repo"), "/tmp": Path("/v/tmp"),
                                   "/mnt/models/models": Path("/srv/sample-models")})
    assert rewrite("127.0.0.1:8000") == f"{POD_IP}:8000"
    assert rewrite("http://localhost:8000/v2") == f"http://{POD_IP}:8000/v2"
    assert rewrite("--liveness=http://0.0.0.0:8080/healthz") == f"--liveness=http://{POD_IP}:8080/healthz"
    assert rewrite("models=/mnt/models/models") == "models=/srv/sample-models"
    assert rewrite("/models/iris") == "/v/repo/iris"
    # One pass: a rewritten path is not rewritten again by a shorter mount.
    assert rewrite("/tmp") == "/v/tmp" and rewrite("/models") == "/v/repo"
    assert rewrite("/var/models") == "/var/models"


def test_a_checkout_under_a_mounted_path_keeps_its_program_path() -> None:
    """CI may clone into /tmp; a pod's /tmp emptyDir must not swallow the venv's programs."""
    venv_bin = Path("/tmp/clone/.venv/bin")
    rewrite = PodRewriter(POD_IP, {"/tmp": Path("/state/pod/tmp"), "/models": Path("/state/pod/repo")})
    container = {"name": "triton", "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
                 "command": ["tritonserver"], "args": ["--model-repository=/models", "--http-port=8000"],
                 "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    argv = container_argv(container, {}, rewrite, venv_bin)
    assert argv[0] == "/tmp/clone/.venv/bin/modelplane-triton"
    assert argv[1:3] == ["--model-repository", "/state/pod/repo"]
    worker = {"name": "worker", "image": "modelplane-worker:e2e", "args": ["--model-store", "/tmp/$(STORE)"]}
    argv = container_argv(worker, {"STORE": "models.json"}, rewrite, venv_bin)
    assert argv == ["/tmp/clone/.venv/bin/modelplane-worker", "--model-store", "/state/pod/tmp/models.json"]


def test_bind_host_is_added_only_where_missing() -> None:
    assert with_bind_host(["/venv/bin/modelplane-worker"], POD_IP) == ["/venv/bin/modelplane-worker", "--host", POD_IP]
    assert with_bind_host(["/venv/bin/modelplane-triton", "--", "-v"], POD_IP) == ["/venv/bin/modelplane-triton", "--host", POD_IP, "--", "-v"]
    assert with_bind_host(["/venv/bin/modelplane-router", "--host=1.2.3.4"], POD_IP) == ["/venv/bin/modelplane-router", "--host=1.2.3.4"]
    assert with_bind_host(["/venv/bin/python", "-m", "x"], POD_IP) == ["/venv/bin/python", "-m", "x"]


def test_kubernetes_variable_expansion() -> None:
    env = {"POD": "web-1", "PORT": "8080"}
    assert expand_vars("--name=$(POD) --port $(PORT) $(MISSING) $$(POD)", env) == "--name=web-1 --port 8080 $(MISSING) $(POD)"
