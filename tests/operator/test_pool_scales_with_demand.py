"""The pool follows demand, against real components: the API server, controller-manager and
scheduler, the operator and router commands, and worker processes run for the pods they create
(tests/hotset_testing/pod_player.py plays the kubelet).

- growth: requests for more models than the pool holds wait for room, none fails, and the pool
  grows until every model has a pod;
- shrink: once idle, the pool goes back to its minimum, draining its emptiest pods first;
- scale to zero: a min-0 dedicated group has no pod when idle; a request then waits while one
  starts, and is served.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import pytest

from hotset_testing.operator_harness import Cluster
from hotset_testing.scaling_stack import ScalingStack, served_model, write_ballast

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def pool_pods(stack: ScalingStack) -> list[str]:
    assert stack.player is not None
    return stack.player.running()


def test_the_pool_grows_to_fit_waiting_requests_then_drains_back_to_its_minimum(cluster: Cluster, tmp_path: Path):
    settings = {"pool_min_pods": 1, "pool_max_pods": 4, "scale_down_delay_s": 2, "queue_wait_s": 0.3,
                "drain_timeout_s": 30}
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, settings) as stack:
        for name in "abcd":  # 60 MiB each: one per 100 MiB pod
            write_ballast(stack.models, name, 60, load_delay_s=0.2, predict_delay_s=0.05)
            stack.apply(served_model(name, 60, idle_s=4))
        stack.wait_for(lambda: len(pool_pods(stack)) == 1, "the pool's one pod running",
                       timeout=180)  # the operator's and the worker's start: minutes on a busy machine

        # Four models wanted at once where one fits: requests queue for room, the pool grows. The
        # clients keep asking until it has grown (the models stay wanted only idleSeconds after their
        # last request), and every answer is counted.
        grown_enough = threading.Event()
        answers: list[int] = []

        def client_loop(offset: int) -> None:
            with httpx.Client() as client:
                i = offset
                while not grown_enough.is_set() or i < offset + 8:
                    answers.append(stack.predict(client, "abcd"[i % 4]).status_code)
                    i += 1

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            clients = [pool.submit(client_loop, n) for n in range(8)]
            try:
                grown = stack.wait_for(lambda: (p := stack.pool()).get("status", {}).get("desiredReplicas", 0) >= 2 and p,
                                       "the WorkerPool asking for more pods")
                assert grown["spec"]["replicas"] >= 2 and "wanted copies" in grown["status"]["reason"]
                stack.wait_for(lambda: len(pool_pods(stack)) == 4, "four pods, one per model", timeout=120)
            finally:
                grown_enough.set()
            for done in clients:
                done.result()
        assert len(answers) >= 64 and set(answers) == {200}
        with httpx.Client() as client:  # every model now has room of its own
            assert [stack.predict(client, m).status_code for m in "abcd" * 3] == [200] * 12

        # Idle for longer than the models' idleSeconds and the scale-down delay: back to one pod,
        # each removal a drained pod (the operator marks it; the ReplicaSet removes exactly it).
        def removed() -> set[str]:
            return {name for _, kind, name in stack.player.events if kind == "gone"}

        stack.wait_for(lambda: stack.replicas("hotset-pool") == 1 and len(removed()) == 3,
                       "the pool back to its minimum", timeout=180)  # drains and ReplicaSet removals: slow on a busy machine
        assert len(pool_pods(stack)) == 1
        log = Path(stack.operator.log_path).read_text()
        # Each removal a drained pod. (On a loaded machine a pod's readiness flaps; the operator
        # then shrinks by a pod that is not ready, which the ReplicaSet ranks first anyway.)
        shrinks = [line.split(": ", 2)[-1] for line in log.splitlines() if " pods (shrinks to " in line]
        assert sum(f"{name} drained" in log for name in removed()) == 3, (sorted(removed()), shrinks)


def test_a_min_zero_dedicated_group_scales_to_zero_and_its_first_request_waits_for_a_pod(cluster: Cluster,
                                                                                       tmp_path: Path):
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, {"pool_min_pods": 0},
                      start_delay_s=2.0) as stack:
        write_ballast(stack.models, "solo", 20, load_delay_s=0.2)
        stack.apply(served_model("solo", 20, min_copies=0, max_copies=2, idle_s=3, placement="dedicated"))
        stack.wait_for(lambda: stack.replicas("solo-dedicated") == 0, "the dedicated group created with no pod")
        assert pool_pods(stack) == []

        started = time.monotonic()
        with httpx.Client() as client:
            answer = stack.predict(client, "solo", timeout_s=60)
        waited = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"]["scaled"] == [2.0]
        assert waited >= 2.0  # it was held while the pod started (2 s of start delay), not refused
        assert stack.replicas("solo-dedicated") == 1
        router_metrics = httpx.get(f"{stack.router.url}/metrics", timeout=5).text
        assert 'hotset_router_pod_waits_total{model="solo",result="served"} 1.0' in router_metrics

        # Idle past replicas.idleSeconds: back to zero pods.
        stack.wait_for(lambda: stack.replicas("solo-dedicated") == 0 and pool_pods(stack) == [],
                       "the group scaled back to zero", timeout=60)


def test_a_request_that_cannot_wait_for_a_pod_is_refused_with_retry_after(cluster: Cluster, tmp_path: Path):
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, {"pool_min_pods": 0},
                      start_delay_s=30.0) as stack:
        write_ballast(stack.models, "slow-start", 20)
        stack.apply(served_model("slow-start", 20, min_copies=0, placement="dedicated"))
        stack.wait_for(lambda: stack.replicas("slow-start-dedicated") == 0, "the dedicated group with no pod")
        with httpx.Client() as client:
            answer = stack.predict(client, "slow-start", timeout_s=2)
        assert answer.status_code == 503 and "Retry-After" in answer.headers
        assert "no pod of 'slow-start' is ready yet: one was asked for" in answer.text
        # ...and the pod it asked for is on its way
        stack.wait_for(lambda: stack.replicas("slow-start-dedicated") == 1, "a pod asked for")


def test_the_pool_size_can_come_from_the_scale_subresource_instead(cluster: Cluster, tmp_path: Path):
    """autoscaling: external: the HPA or KEDA (here kubectl scale, the same API) sets spec.replicas."""
    settings = {"pool_min_pods": 1, "pool_max_pods": 3, "pool_autoscaling": "external"}
    with ScalingStack(cluster.kube, cluster.namespace, tmp_path, settings) as stack:
        stack.wait_for(lambda: stack.pool().get("status", {}).get("selector"), "the WorkerPool's status")
        scale = stack.kubectl("get", "--raw", f"/apis/hotset.io/v1alpha1/namespaces/{cluster.namespace}"
                              "/workerpools/hotset-pool/scale").stdout
        assert '"selector":"app.kubernetes.io/part-of=hotset' in scale
        stack.kubectl("scale", "workerpool/hotset-pool", "--replicas=3")
        stack.wait_for(lambda: len(pool_pods(stack)) == 3, "three pods, as the scale subresource asked", timeout=90)
        stack.kubectl("scale", "workerpool/hotset-pool", "--replicas=9")
        stack.wait_for(lambda: stack.pool().get("status", {}).get("desiredReplicas") == 3, "held at maxReplicas")

        # A real HorizontalPodAutoscaler drives the pool through the same subresource. Its metrics need
        # a metrics API, which this control plane has not, but it still holds the size within its
        # bounds: from 9 asked down to its maxReplicas, 2, and the pool follows by draining a pod.
        stack.apply({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                     "metadata": {"name": "pool"},
                     "spec": {"scaleTargetRef": {"apiVersion": "hotset.io/v1alpha1", "kind": "WorkerPool",
                                                 "name": "hotset-pool"},
                              "minReplicas": 1, "maxReplicas": 2,
                              "metrics": [{"type": "Resource", "resource": {
                                  "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}})

        def able_to_scale() -> dict | None:
            conditions = ((stack.get("hpa", "pool") or {}).get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "AbleToScale" and c["reason"] == "SucceededRescale"), None)

        condition = stack.wait_for(able_to_scale, "the HPA rescaling the WorkerPool", timeout=120)
        assert condition["message"] == "the HPA controller was able to update the target scale to 2"
        assert stack.pool()["spec"]["replicas"] == 2
        stack.wait_for(lambda: len(pool_pods(stack)) == 2 and stack.replicas("hotset-pool") == 2,
                       "the pool at the HPA's size", timeout=60)

