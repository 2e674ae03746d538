"""The whole platform on the local control plane, installed through the Helm chart.

``helm template charts/modelplane`` with e2e/local/values.yaml, then
``kubectl apply``: the e2e proves the chart, not a hand-written manifest. The
node agent runs what the chart and the operator create. Pod IPs are loopback
addresses here, so the router and the workers are reached at their pod IPs.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_process import AgentProcess
from modelplane_testing.kube_cluster import KubeCluster
from scenarios.chart import REPO, ChartInstall, helm_template_argv
from scenarios.platform import Kube, is_true, models_volume, wait_for

VALUES = Path(__file__).resolve().parent / "values.yaml"
NAMESPACE = "modelplane"
ROUTER_SELECTOR = "app.kubernetes.io/component=router"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"


def render_chart(cluster: KubeCluster, overrides: dict[str, Any]) -> str:
    """The chart as Helm renders it with the local values (and any --set overrides)."""
    helm = cluster.binaries.helm
    if helm is None:
        raise RuntimeError("helm is missing: run `make install-k8s`")
    argv = helm_template_argv(str(helm), NAMESPACE, VALUES, overrides)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class LocalPlatform(ChartInstall):
    cluster: KubeCluster
    agent: AgentProcess
    namespace: str = NAMESPACE
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def kubectl(self) -> KubeCluster:
        return self.cluster

    @property
    def kube(self) -> Kube:
        return Kube(self.cluster, self.namespace)

    def rendered_manifest(self) -> str:
        return render_chart(self.cluster, self.overrides)

    def _ready_pod(self, selector: str) -> dict[str, Any]:
        pods = [p for p in self.kube.items("pods", "-l", selector) if is_true(p, "Ready") and not p["metadata"].get("deletionTimestamp")]
        if not pods:
            raise LookupError(f"no Ready pod matches {selector}")
        return pods[0]

    @property
    def router_url(self) -> str:
        pod = self._ready_pod(ROUTER_SELECTOR)
        port = next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if p.get("name") == "http")
        return f"http://{pod['status']['podIP']}:{port}"

    def worker_url(self, pod: str) -> str:
        body = self.kube.get("pod", pod)
        return f"http://{body['status']['podIP']}:8080"

    def kill_container(self, pod: str, container: str) -> None:
        """SIGKILL the container's processes (its process group), as a crash or OOM kill of the container would."""
        os.killpg(self.agent.container_pid(self.namespace, pod, container), signal.SIGKILL)

    def wait_installed(self, timeout: float = 240) -> None:
        for what, selector in (("operator", OPERATOR_SELECTOR), ("router", ROUTER_SELECTOR)):
            wait_for(f"the {what} pod Ready", lambda: self._ready_pod(selector), timeout, interval=1.0)


def prepare_namespace(cluster: KubeCluster, models_dir: Path) -> None:
    """The release's namespace and the sample models' volume (a hostPath PV and its claim)."""
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    wait_for("the default ServiceAccount of the release namespace",
             lambda: cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0, 60)
    cluster.kubectl("apply", "-f", "-", input=models_volume(models_dir, NAMESPACE))
