"""The shared pool gets enough pods for every declared minimum copy, and shrinks back."""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_operator import pool
from hotset_testing.operator_harness import Cluster, operator_config, served_model, wait_for

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
    pod = wait_for(lambda: cluster.items("pods", "hotset.io/pool=shared"), "a pool pod")[0]
    env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HOTSET_PINNED_MODELS"] == ""
