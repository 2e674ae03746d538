"""The shared pool gets enough pods for every declared minimum copy, and shrinks back."""
from __future__ import annotations

import json

from modelplane_common.spec import ModelSpec
from modelplane_operator import pool
from modelplane_testing.operator_harness import Cluster, operator_config, served_model, wait_for

GI = 2**30


def _spec(name: str, gib: float, copies: int, placement: str = "shared") -> ModelSpec:
    return ModelSpec(id=name, framework="transformers", source=f"pvc://m/{name}", memory=int(gib * GI),
                     replicas={"min": copies, "max": max(copies, 1)}, placement=placement)


def test_copies_of_one_model_need_distinct_pods() -> None:
    # Three 1 GiB copies fit one 4 GiB pod by bytes, but copies must be spread.
    assert pool.packed_pods([_spec("a", 1, 3)], 4 * GI) == 3


def test_small_models_fill_gaps_left_by_large_ones() -> None:
    specs = [_spec("big", 3, 2), _spec("small", 1, 2), _spec("lazy", 2, 0), _spec("own", 3, 2, "dedicated")]
    assert pool.lower_bound(specs, 4 * GI) == 2
    assert pool.packed_pods(specs, 4 * GI) == 2


def test_packing_never_undercuts_the_lower_bound() -> None:
    specs = [_spec("x", 2.5, 1), _spec("y", 2.5, 1), _spec("z", 2.5, 1)]
    assert pool.lower_bound(specs, 4 * GI) == 2  # 7.5 GiB / 4 GiB
    assert pool.packed_pods(specs, 4 * GI) == 3  # but no two fit one pod


def test_pool_size_is_clamped_by_settings() -> None:
    config = operator_config("ns", pool_min_pods=1, pool_max_pods=3)
    assert pool.desired_pool_size([], config) == 1
    assert pool.desired_pool_size([_spec("a", 1, 3), _spec("b", 3.5, 3), _spec("c", 3.5, 1)], config) == 3


def _pool_replicas(cluster: Cluster, name: str) -> int | None:
    return ((cluster.get("deployment", name) or {}).get("spec") or {}).get("replicas")


def test_pool_deployment_follows_declared_min_copies(cluster: Cluster, operator) -> None:
    config, _ = operator
    wait_for(lambda: _pool_replicas(cluster, config.pool_name) == config.pool_min_pods, "the pool at its minimum")
    cluster.apply(served_model("big", memory="3Gi", replicas={"min": 2, "max": 2}))
    cluster.apply(served_model("small", memory="512Mi", replicas={"min": 1, "max": 2}))
    wait_for(lambda: _pool_replicas(cluster, config.pool_name) == 2, "the pool grown to 2 pods")
    cluster.apply(served_model("wide", memory="512Mi", replicas={"min": 3, "max": 3}))
    wait_for(lambda: _pool_replicas(cluster, config.pool_name) == 3, "the pool grown to 3 pods")

    cluster.kubectl("delete", "servedmodel", "wide", "big", "--timeout=30s")
    wait_for(lambda: _pool_replicas(cluster, config.pool_name) == 1, "the pool shrunk back to 1 pod")
    pod = wait_for(lambda: cluster.items("pods", "modelplane.io/pool=shared"), "a pool pod")[0]
    env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MODELPLANE_PINNED_MODELS"] == ""


def test_a_changed_model_store_is_announced_on_the_worker_pods(cluster: Cluster, operator) -> None:
    """Each worker pod carries the model store's resourceVersion, so its kubelet remounts the
    ConfigMap when it changes instead of on its next periodic sync."""
    config, _ = operator
    wait_for(lambda: cluster.items("pods", "modelplane.io/pool=shared"), "a pool pod")

    def announced() -> bool:
        store = cluster.get("configmap", config.model_store_configmap) or {}
        version = store.get("metadata", {}).get("resourceVersion")
        pods = cluster.items("pods", "modelplane.io/pool=shared")
        return bool(pods) and all(p["metadata"].get("annotations", {}).get("modelplane.io/model-store-version")
                                  == version for p in pods)

    cluster.apply(served_model("fresh", memory="512Mi"))
    wait_for(lambda: "fresh" in json.dumps((cluster.get("configmap", config.model_store_configmap) or {}).get("data"))
             and announced(), "the pool pod told of the model store listing the new model")
