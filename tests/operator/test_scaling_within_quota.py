"""Demand-driven scaling held within the namespace's ModelQuota, against the real API server and operator.

A namespace pool (``workers.pool.mode: namespace``) runs whole pods of one
GPU each. Admission counts a shared copy's GPUs as its share of a pod by bytes,
so three models of 60% of a pod are 1.8 GPUs there, and are admitted beside a
dedicated model's pod under a quota of 3 GPUs; but they pack into three pods.
The operator now holds the pool at the two pods the quota leaves beside the
dedicated group's, and says so; raised to 4 GPUs, the pool gets its third pod,
and a min-0 dedicated group woken by a request (the router's wanted-at
annotation) is held at zero pods, with an event naming the quota, until a
model leaves and room returns.
"""
from __future__ import annotations

import time

import pytest

from hotset_common import labels
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def replicas(cluster: Cluster, deployment: str) -> int | None:
    return ((cluster.get("deployment", deployment) or {}).get("spec") or {}).get("replicas")


def pool_status(cluster: Cluster, name: str) -> dict:
    return (cluster.get("workerpool", name) or {}).get("status") or {}


def accepted(cluster: Cluster, name: str) -> bool:
    return (cluster.condition(name, "Accepted") or {}).get("status") == "True"


def test_a_namespace_pool_and_its_dedicated_groups_never_take_more_gpus_than_the_quota(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace, pool_mode="namespace", watch_namespaces=(cluster.namespace,),
                             pool_min_pods=0, pool_max_pods=6)  # 4 GiB pods of 1 GPU
    pool = config.pool_name
    with running_operator(config):
        cluster.apply({"apiVersion": "hotset.io/v1alpha1", "kind": "ModelQuota", "metadata": {"name": "team"},
                       "spec": {"gpus": 3}})
        for name in ("s1", "s2", "s3"):  # 60% of a pod each: no two share one
            cluster.apply(served_model(name, memory="2457Mi", replicas={"min": 1, "max": 1}))
        cluster.apply(served_model("solo", memory="1Gi", placement="dedicated", replicas={"min": 1, "max": 1}))
        wait_for(lambda: all(accepted(cluster, m) for m in ("s1", "s2", "s3", "solo")), "all four admitted (2.8 GPUs)")

        # the pool wants 3 pods for its 3 copies; the quota leaves 2 beside solo's pod
        status = wait_for(lambda: (s := pool_status(cluster, pool)).get("desiredReplicas") == 2 and s,
                          "the pool held at 2 pods", timeout=60)
        assert "held by quota" in status["reason"] and "ModelQuota team" in status["reason"], status["reason"]
        assert "allows 3 GPUs" in status["reason"] and "room for 2 pods (of 3 wanted)" in status["reason"]
        wait_for(lambda: replicas(cluster, pool) == 2, "the pool's Deployment at 2 pods")
        wait_for(lambda: replicas(cluster, "solo-dedicated") == 1, "solo's one pod: its floor is kept")
        time.sleep(3 * config.pool_sync_interval_s)  # passes that could grow it, had the quota not held
        assert replicas(cluster, pool) == 2

        # room for the third pod, and a min-0 dedicated model beside it (admitted: 1.8 + 1 + 1 GPUs)
        cluster.kubectl("patch", "modelquota", "team", "--type=merge", "-p", '{"spec": {"gpus": 4}}')
        wait_for(lambda: replicas(cluster, pool) == 3, "the pool's third pod once the quota grew", timeout=60)
        cluster.apply(served_model("late", memory="1Gi", placement="dedicated",
                                   replicas={"min": 0, "max": 1, "idleSeconds": 600}))
        wait_for(lambda: accepted(cluster, "late") and replicas(cluster, "late-dedicated") == 0, "late admitted, at zero")
        cluster.kubectl("annotate", "servedmodel", "late", f"{labels.WANTED_AT}={time.time():.3f}", "--overwrite")
        event = wait_for(lambda: next((e for e in cluster.events("late") if e["reason"] == "QuotaHeldScaling"), None),
                         "the event saying the quota holds late's group", timeout=60)
        assert "held at 0 pods where demand asks 1" in event["message"] and "ModelQuota team" in event["message"]
        assert "allows 4 GPUs" in event["message"] and "its other workloads take 4 GPUs" in event["message"]
        assert replicas(cluster, "late-dedicated") == 0

        # a model leaves: the pool shrinks by a pod and the woken group gets it
        cluster.kubectl("annotate", "servedmodel", "late", f"{labels.WANTED_AT}={time.time():.3f}", "--overwrite")
        cluster.kubectl("delete", "servedmodel", "s3")
        wait_for(lambda: replicas(cluster, pool) == 2 and replicas(cluster, "late-dedicated") == 1,
                 "the freed GPU going to late's group", timeout=90)
        assert replicas(cluster, "solo-dedicated") == 1
