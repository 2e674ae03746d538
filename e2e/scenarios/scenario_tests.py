"""The issue's scenarios as pytest tests, collected where this module is star-imported.

e2e/kind/test_platform_scenarios.py does ``from scenarios.scenario_tests import *``:
pytest then runs these tests on the kind tier's ``platform`` and ``sm_kube``
fixtures. A new scenario is one function in a scenario module (served_models.py,
or a module of its own for a subject of its own: openai_api.py, gpu_nodes.py) and
one test here. They run in this order on one platform (see served_models.py for
why the order matters; the last two leave the cluster as they found it).
"""
from __future__ import annotations

from scenarios import gpu_nodes, openai_api
from scenarios import served_models as scenario


def test_three_frameworks_served_through_router(platform, sm_kube) -> None:
    scenario.three_frameworks_served(platform, sm_kube)


def test_least_recently_used_model_evicted(platform, sm_kube) -> None:
    scenario.least_recently_used_evicted(platform, sm_kube)


def test_dedicated_group_of_two_ready_after_load(platform, sm_kube) -> None:
    scenario.dedicated_group_of_two(platform, sm_kube)


def test_dedicated_group_scales_to_zero_and_back_for_a_request(platform, sm_kube) -> None:
    scenario.dedicated_group_scales_to_zero(platform, sm_kube)


def test_hot_model_gets_another_copy(platform, sm_kube) -> None:
    scenario.hot_model_gets_another_copy(platform, sm_kube)


def test_killed_worker_leaves_router_and_recovers(platform, sm_kube) -> None:
    scenario.killed_worker_leaves_and_returns(platform, sm_kube)


def test_a_crashed_triton_stops_only_its_models_and_comes_back_in_place(platform, sm_kube) -> None:
    scenario.killed_triton_process(platform, sm_kube)


def test_deleted_model_unloaded_and_gone(platform, sm_kube) -> None:
    scenario.deleted_model_unloaded(platform, sm_kube)


def test_missing_source_reported_nothing_else_disturbed(platform, sm_kube) -> None:
    scenario.missing_source_reported(platform, sm_kube)


def test_canary_then_promoted_with_no_failed_request(platform, sm_kube) -> None:
    scenario.canary_then_promote(platform, sm_kube)


def test_model_from_s3_served_through_router(platform, sm_kube) -> None:
    scenario.model_from_s3_served(platform, sm_kube)


def test_model_from_an_oci_image_served_through_an_image_volume(platform, sm_kube) -> None:
    scenario.model_from_oci_image_served(platform, sm_kube)


def test_openai_chat_stream_and_embeddings_through_the_router(platform, sm_kube) -> None:
    openai_api.openai_api_served(platform, sm_kube)


def test_a_tolerating_worker_pod_lands_on_a_tainted_gpu_node(platform, sm_kube) -> None:
    gpu_nodes.tolerating_pod_on_the_gpu_node(platform, sm_kube)
