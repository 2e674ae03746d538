"""The worker's options come from flags or MODELPLANE_* variables (how the operator sets pods up)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from modelplane_testing.worker_server import serve_in_thread, wait_until
from modelplane_worker import main


def test_every_option_can_come_from_the_environment() -> None:
    env = {
        "MODELPLANE_MODEL_STORE": "/etc/models.json",
        "MODELPLANE_HOST": "0.0.0.0",
        "MODELPLANE_PORT": "9000",
        "MODELPLANE_MEMORY_BUDGET": "2Gi",
        "MODELPLANE_MAX_MODELS": "3",
        "MODELPLANE_TRITON_URL": "127.0.0.1:8000",
        "MODELPLANE_TRITON_REPOSITORY": "/models",
        "MODELPLANE_POD_NAME": "pod-7",
        "MODELPLANE_PINNED_MODELS": "a, b",
        "MODELPLANE_MAX_BODY_BYTES": "1Mi",
        "MODELPLANE_SOURCE_ROOTS": "models=/mnt/models,extra=/mnt/extra",
        "MODELPLANE_MIN_RESIDENCY_S": "2.5",
        "MODELPLANE_FAILED_LOAD_BACKOFF_S": "0.5",
        "MODELPLANE_VLLM_COMMAND": "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server",
        "MODELPLANE_VLLM_DEVICE_MEMORY": "80Gi",
        "MODELPLANE_VLLM_START_TIMEOUT_S": "900",
    }
    settings = main.parse_settings([], env)
    assert settings == main.Settings(
        model_store=Path("/etc/models.json"), host="0.0.0.0", port=9000, memory_budget=2 * 2**30, max_models=3,
        triton_url="127.0.0.1:8000", triton_repository=Path("/models"), pod_name="pod-7", pinned=("a", "b"),
        max_body_bytes=2**20, source_roots={"models": Path("/mnt/models"), "extra": Path("/mnt/extra")},
        min_residency_s=2.5, failed_load_backoff_s=0.5,
        vllm_command=("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"),
        vllm_device_memory=80 * 2**30, vllm_start_timeout_s=900.0,
    )


def test_flags_win_over_the_environment() -> None:
    env = {"MODELPLANE_MODEL_STORE": "/env.json", "MODELPLANE_MEMORY_BUDGET": "1Gi", "MODELPLANE_TRITON_URL": "x:1"}
    settings = main.parse_settings(
        ["--model-store", "/flag.json", "--memory-budget", "512Mi", "--triton-url", "", "--source-root", "c=/p"], env
    )
    assert (settings.model_store, settings.memory_budget, settings.triton_url) == (Path("/flag.json"), 512 * 2**20, "")
    assert settings.source_roots == {"c": Path("/p")}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--model-store"),
        (["--model-store", "s.json", "--memory-budget", "lots"], "not a memory quantity"),
        (["--model-store", "s.json", "--source-root", "nopath"], "CLAIM=PATH"),
        (["--model-store", "s.json", "--failed-load-backoff-s", "-1"], "--failed-load-backoff-s"),
    ],
)
def test_bad_options_exit_with_a_message_naming_them(argv, message, capsys) -> None:
    with pytest.raises(SystemExit):
        main.parse_settings(argv, {})
    assert message in capsys.readouterr().err


def test_a_pinned_model_missing_from_the_store_keeps_the_pod_unready_naming_it(tmp_path) -> None:
    store = tmp_path / "models.json"
    store.write_text(json.dumps({"models": [{"id": "a", "framework": "triton", "source": "file:///m"}]}))
    settings = main.parse_settings(["--model-store", str(store), "--memory-budget", "1Gi", "--pinned", "ghost"], {})
    with serve_in_thread(main.build_app(settings)) as url:
        wait_until(lambda: httpx.get(f"{url}/v2/health/ready").json()["prepared"], what="start-up preparation")
        ready = httpx.get(f"{url}/v2/health/ready")
        assert ready.status_code == 503 and ready.json()["pinned_not_loaded"] == ["ghost"]
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
