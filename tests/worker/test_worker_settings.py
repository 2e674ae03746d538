"""The worker's options come from flags or HOTSET_* variables (how the operator sets pods up), all
declared once in hotset_common.worker_settings: the command line, the operator's pod spec and
docs/worker.md's table are made from that one table."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hotset_common import slow_clients, worker_settings
from hotset_common.slow_clients import ClientLimits
from hotset_common.worker_settings import WorkerOption
from hotset_operator import workloads
from hotset_testing.operator_harness import operator_config
from hotset_testing.worker_server import serve_in_thread, wait_until
from hotset_worker import main

REPO = Path(__file__).resolve().parents[2]


def test_the_options_defaults_are_the_settings_defaults() -> None:
    """A worker started with no option but its store runs as Settings() says, so a test or an
    embedder building Settings directly gets the worker the command line gives."""
    assert main.parse_settings(["--model-store", "s.json"], {}) == main.Settings(model_store=Path("s.json"))


def test_the_docs_table_is_the_one_the_options_make() -> None:
    docs = (REPO / "docs" / "worker.md").read_text()
    start, end = docs.index(worker_settings.DOCS_BEGIN), docs.index(worker_settings.DOCS_END)
    assert docs[start:end + len(worker_settings.DOCS_END)] == worker_settings.markdown_table(), (
        "docs/worker.md's options table is stale: python -m hotset_common.worker_settings prints it")


def test_every_variable_the_operator_sets_is_a_worker_option() -> None:
    container = workloads.build_worker_container(operator_config("ops", worker_identity="pod-token",
                                                                 worker_service_account="hotset-worker"), ["a"])
    known = {option.env for option in WorkerOption}
    set_by_operator = {entry["name"] for entry in container["env"]} - {"HOME"}
    assert set_by_operator <= known, set_by_operator - known
    assert {WorkerOption.CATALOG_URL.env, WorkerOption.CALLER_KEYS.env, WorkerOption.TRUSTED_CALLERS.env,
            WorkerOption.IDENTITY_TOKEN_FILE.env, WorkerOption.CATALOG_TOKEN_FILE.env,
            WorkerOption.PINNED.env} <= set_by_operator
    assert WorkerOption.API_TOKEN.env not in set_by_operator  # no shared token in cluster pods


def test_every_option_can_come_from_the_environment() -> None:
    env = {
        "HOTSET_MODEL_STORE": "/etc/models.json",
        "HOTSET_HOST": "0.0.0.0",
        "HOTSET_PORT": "9000",
        "HOTSET_GRPC_PORT": "9001",
        "HOTSET_MEMORY_BUDGET": "2Gi",
        "HOTSET_MAX_MODELS": "3",
        "HOTSET_TRITON_URL": "127.0.0.1:8000",
        "HOTSET_TRITON_REPOSITORY": "/models",
        "HOTSET_POD_NAME": "pod-7",
        "HOTSET_PINNED_MODELS": "a, b",
        "HOTSET_MAX_BODY_BYTES": "1Mi",
        "HOTSET_SOURCE_ROOTS": "models=/mnt/models,extra=/mnt/extra",
        "HOTSET_MIN_RESIDENCY_S": "2.5",
        "HOTSET_FAILED_LOAD_BACKOFF_S": "0.5",
        "HOTSET_VLLM_COMMAND": "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server",
        "HOTSET_VLLM_DEVICE_MEMORY": "80Gi",
        "HOTSET_VLLM_START_TIMEOUT_S": "900",
    }
    settings = main.parse_settings([], env)
    assert settings == main.Settings(
        model_store=Path("/etc/models.json"), host="0.0.0.0", port=9000, grpc_port=9001, memory_budget=2 * 2**30, max_models=3,
        triton_url="127.0.0.1:8000", triton_repository=Path("/models"), pod_name="pod-7", pinned=("a", "b"),
        max_body_bytes=2**20, source_roots={"models": Path("/mnt/models"), "extra": Path("/mnt/extra")},
        min_residency_s=2.5, failed_load_backoff_s=0.5,
        vllm_command=("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"),
        vllm_device_memory=80 * 2**30, vllm_start_timeout_s=900.0,
    )


def test_flags_win_over_the_environment() -> None:
    env = {"HOTSET_MODEL_STORE": "/env.json", "HOTSET_MEMORY_BUDGET": "1Gi", "HOTSET_TRITON_URL": "x:1"}
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
        (["--model-store", "s.json", "--grpc-port", "grpc"], "--grpc-port must be a port number"),
        (["--model-store", "s.json", "--caller-keys", "/k"], "--caller-keys needs --trusted-callers"),
        (["--model-store", "s.json", "--caller-keys", "/k", "--trusted-callers", "a:b", "--api-token", "t"],
         "two ways to check callers"),
        (["--model-store", "s.json", "--trusted-callers", "hotset-router"], "not a ServiceAccount as namespace:name"),
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


GiB = 2**30


@pytest.mark.parametrize(("total", "share"), [(8 * GiB, 0.775), (16 * GiB, 0.8375), (80 * GiB, 0.8875)])
def test_the_default_gpu_budget_leaves_a_reserve_that_fits_small_gpus(total: int, share: float) -> None:
    """90% of the device, the old default, left 0.8 GiB of an 8 GiB GPU for everything but weights."""
    from hotset_worker import memory

    budget, cut = memory.gpu_model_budget(total, None)
    assert cut == "" and budget / total == pytest.approx(share, abs=1e-6)
    assert total - budget >= GiB + total // 10 - 1


def test_a_budget_the_gpu_cannot_hold_is_cut_to_what_it_can_and_says_so() -> None:
    from hotset_worker import memory

    budget, cut = memory.gpu_model_budget(16 * GiB, 16 * GiB)  # the chart's 16Gi on a 16 GB GPU
    assert budget == memory.gpu_model_budget(16 * GiB, None)[0]
    assert "16.0Gi does not fit this GPU" in cut and "--gpu-reserve" in cut
    assert memory.gpu_model_budget(16 * GiB, 10 * GiB) == (10 * GiB, "")  # one that fits stays
    assert memory.gpu_model_budget(16 * GiB, 16 * GiB, reserve=0) == (16 * GiB, "")  # an explicit reserve wins


def test_the_gpu_reserve_comes_from_a_flag_or_the_environment() -> None:
    assert main.parse_settings(["--model-store", "s.json"], {"HOTSET_GPU_RESERVE": "3Gi"}).gpu_reserve == 3 * GiB
    assert main.parse_settings(["--model-store", "s.json", "--gpu-reserve", "0"], {}).gpu_reserve == 0
    assert main.parse_settings(["--model-store", "s.json"], {}).gpu_reserve is None


def test_the_slow_client_bounds_are_options_of_the_table_for_the_worker_and_the_router(monkeypatch) -> None:
    """One declaration (worker_settings.CLIENT_LIMITS) gives both servers the same flags and variables,
    and docs/worker.md's table lists them."""
    from hotset_router import main as router_main

    env = {"HOTSET_CLIENT_HEAD_TIMEOUT_S": "3", "HOTSET_MAX_HEAD_BYTES": "9000", "HOTSET_CLIENT_BODY_TIMEOUT_S": "4",
           "HOTSET_CLIENT_BODY_MIN_RATE": "1000", "HOTSET_MAX_CONNECTIONS": "50", "HOTSET_GRPC_CONNECTION_AGE_S": "7"}
    wanted = ClientLimits(head_timeout_s=3, max_head_bytes=9000, body_timeout_s=4, body_min_rate=1000,
                          max_connections=50, grpc_connection_age_s=7)
    assert main.parse_settings(["--model-store", "s.json"], env).client_limits == wanted
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert slow_clients.from_arguments(router_main.parse_args([])) == wanted
    assert slow_clients.from_arguments(router_main.parse_args(["--max-connections", "60"])).max_connections == 60
    table = worker_settings.markdown_table()
    assert all(f"`{member.env}`" in table for member in worker_settings.CLIENT_LIMITS.values())
    assert ClientLimits() == main.Settings(model_store=None).client_limits  # the table's defaults


@pytest.mark.parametrize("argv", [["--max-connections", "0"], ["--client-head-timeout-s", "0"],
                                  ["--grpc-connection-age-s", "-1"]])
def test_a_bound_that_is_not_positive_is_refused_naming_the_limits(argv, capsys) -> None:
    with pytest.raises(SystemExit):
        main.parse_settings(["--model-store", "s.json", *argv], {})
    assert "client limits must be positive" in capsys.readouterr().err
