"""hotset-triton starts the real tritonserver the way the pod's sidecar container does."""
from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from hotset_testing.triton import TritonServer
from hotset_worker import triton_sidecar


def test_the_sidecar_pid_is_tritonserver_itself(tritonserver: TritonServer) -> None:
    process = psutil.Process(tritonserver.pid)
    assert process.name() == "tritonserver"  # os.execve: signals reach Triton, not a wrapper
    command = process.cmdline()
    assert "--model-control-mode=explicit" in command and "--strict-readiness=false" in command
    assert f"--model-repository={tritonserver.repository}" in command


def test_it_answers_on_its_three_loopback_ports(tritonserver: TritonServer) -> None:
    assert httpx.get(f"{tritonserver.http_url}/v2/health/live", timeout=5).status_code == 200
    metrics = httpx.get(f"http://127.0.0.1:{tritonserver.metrics_port}/metrics", timeout=5)
    assert metrics.status_code == 200 and "nv_" in metrics.text
    listening = {c.laddr.port for c in psutil.Process(tritonserver.pid).net_connections() if c.status == "LISTEN"}
    assert {tritonserver.http_port, tritonserver.grpc_port, tritonserver.metrics_port} <= listening


def test_the_wheel_binary_gets_its_libraries_and_the_debian_python_venv(tmp_path: Path) -> None:
    binary = triton_sidecar.pytriton_binary()
    assert binary is not None, "nvidia-pytriton is a worker dependency"
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    launch = triton_sidecar.build_launch(
        binary=binary, model_repository=tmp_path / "repo", http_port=1, grpc_port=2, metrics_port=3,
        host="127.0.0.1", triton_venv=venv, base_env={"PYTHONHOME": "/elsewhere", "PATH": "/usr/bin"},
        extra_args=["--log-verbose=1"],
    )
    assert "PYTHONHOME" not in launch.env
    assert launch.env["PATH"].split(":")[0] == str(venv / "bin")  # the stub finds its prefix through PATH
    assert launch.env["LD_LIBRARY_PATH"].split(":")[0].endswith("nvidia_pytriton.libs")
    assert launch.argv[-1] == "--log-verbose=1"
    assert "--http-port=1" in launch.argv and "--grpc-port=2" in launch.argv and "--metrics-port=3" in launch.argv


def test_the_wheel_binary_without_a_venv_says_how_to_install_one(tmp_path: Path) -> None:
    binary = triton_sidecar.pytriton_binary()
    assert binary is not None
    with pytest.raises(triton_sidecar.LaunchError, match="install-triton.sh"):
        triton_sidecar.build_launch(binary, tmp_path, 1, 2, 3, "127.0.0.1", None, {}, [])


def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    with pytest.raises(triton_sidecar.LaunchError, match="does-not-exist"):
        triton_sidecar.find_binary(str(tmp_path / "does-not-exist"))


def test_dry_run_prints_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    triton_sidecar.main(["--model-repository", str(tmp_path / "repo"), "--http-port", "9000", "--dry-run"])
    printed = capsys.readouterr().out
    assert "tritonserver" in printed and "--http-port=9000" in printed and "--model-control-mode=explicit" in printed
