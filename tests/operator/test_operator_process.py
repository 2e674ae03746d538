"""The `hotset-operator` command, as the chart's Deployment runs it: settings from
HOTSET_OPERATOR_* variables, kopf's liveness endpoint, stopped by its pid."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from hotset_testing.kube_cluster import free_port
from hotset_testing.operator_harness import Cluster, served_model, wait_for


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_operator_command_reads_its_settings_from_the_environment(cluster: Cluster, tmp_path: Path) -> None:
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    env = {**os.environ, "KUBECONFIG": str(cluster.kube.kubeconfig),
           "HOTSET_OPERATOR_NAMESPACE": cluster.namespace, "HOTSET_OPERATOR_GPU_MODE": "none",
           "HOTSET_OPERATOR_POD_MEMORY_BUDGET": "2Gi", "HOTSET_OPERATOR_POOL_MIN_PODS": "2",
           "HOTSET_OPERATOR_WORKER_IMAGE": "registry.example/worker:env",
           "HOTSET_OPERATOR_CATALOG_HOST": "127.0.0.1", "HOTSET_OPERATOR_CATALOG_PORT": str(free_port())}
    log = (tmp_path / "operator.log").open("w")
    command = [str(Path(sys.executable).parent / "hotset-operator"), f"--liveness={liveness}"]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or _healthy(liveness), "the liveness endpoint")
        assert process.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
        cluster.apply(served_model("from-env", placement="dedicated", memory="3Gi", replicas={"min": 1, "max": 1}))
        accepted = wait_for(lambda: cluster.condition("from-env", "Accepted"), "Accepted on from-env")
        assert accepted["status"] == "False" and "2.0Gi" in accepted["message"]  # the budget from the environment

        cluster.apply(served_model("from-env", placement="dedicated", memory="1Gi", replicas={"min": 1, "max": 1}))
        deployment = wait_for(lambda: cluster.get("deployment", "from-env-dedicated"), "the dedicated Deployment")
        worker = deployment["spec"]["template"]["spec"]["containers"][0]
        assert worker["image"] == "registry.example/worker:env"
        assert "nvidia.com/gpu" not in worker["resources"]["limits"] and "claims" not in worker["resources"]
        assert "resourceClaims" not in deployment["spec"]["template"]["spec"]  # gpu mode none, from the environment
        wait_for(lambda: ((cluster.get("deployment", "hotset-pool") or {}).get("spec") or {}).get("replicas") == 2,
                 "the pool at its minimum from the environment (2)")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
