"""hotset on the kind cluster: installed with helm, reached through kubectl port-forward.

The chart goes in as a user installs it (``helm upgrade --install`` with
e2e/kind/values.yaml and ``--set-string`` overrides); the router and the worker
pods are reached through ``kubectl port-forward``, containers are killed with
``kubectl exec``. Every port-forward it starts is stopped by pid.
"""
from __future__ import annotations

import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import NODE_MODELS_DIR, KindCluster, run, tool
from hotset_testing.processes import free_port
from scenarios.chart import CHART, RELEASE
from scenarios.platform import Kube, is_true, models_volume, wait_for

HERE = Path(__file__).resolve().parent
VALUES = HERE / "values.yaml"
NAMESPACE = "hotset"
# The tier's client: a ServiceAccount of a namespace of its own (as an application's would be), allowed
# to call every model by a ClusterRoleBinding to the chart's model-caller role.
CALLER_NAMESPACE, CALLER = "e2e-callers", "app"
CALLER_AUDIENCE = "hotset"  # the chart's router.auth.audiences


@dataclass
class KindPlatform:
    cluster: KindCluster
    namespace: str = NAMESPACE
    overrides: dict[str, Any] = field(default_factory=dict)
    _forwards: dict[str, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)
    _caller_token: str = ""

    @property
    def kubectl(self) -> KindCluster:
        return self.cluster

    @property
    def kube(self) -> Kube:
        return Kube(self.cluster, self.namespace)

    def helm(self, *args: str, timeout: float = 300) -> str:
        return run(tool("helm") or "helm", "--kubeconfig", str(self.cluster.kubeconfig), "--namespace",
                   self.namespace, *args, timeout=timeout)

    def prepare(self) -> None:
        """The namespace and the sample models' PersistentVolume + claim (a hostPath on every node)."""
        self.cluster.kubectl("create", "namespace", self.namespace, check=False)
        self.cluster.kubectl("apply", "-f", "-", input=models_volume(Path(NODE_MODELS_DIR), self.namespace))

    def install(self, **overrides: Any) -> None:
        """helm upgrade --install with the tier's values plus these overrides (added to the earlier ones)."""
        self.overrides.update(overrides)
        argv = ["upgrade", "--install", RELEASE, str(CHART), "-f", str(VALUES)]
        for key, value in self.overrides.items():
            argv += ["--set-string", f"{key}={value}"]
        self.helm(*argv)

    def set_pool_size(self, pods: int) -> None:
        self.install(**{"workers.pool.minPods": pods})

    def set_memory_budget(self, budget_bytes: int) -> None:
        self.install(**{"workers.memoryBudget": budget_bytes})

    def set_gpu_mode(self, mode: str) -> None:
        self.install(**{"workers.gpu.mode": mode})

    def wait_installed(self, timeout: float = 600) -> None:
        for component in ("operator", "router"):
            selector = f"app.kubernetes.io/component={component}"
            wait_for(f"the {component} pod Ready",
                     lambda: any(is_true(p, "Ready") for p in self.kube.items("pods", "-l", selector)), timeout, 2.0,
                     show=lambda: self.pod_state(selector))

    def pod_state(self, selector: str) -> str:
        """Why pods matching `selector` are not Ready: their containers' states and their last log
        lines (what a timed-out install reports, since the cluster is gone after the run)."""
        found = []
        for pod in self.kube.items("pods", "-l", selector):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            states = {s["name"]: s.get("state") for s in statuses}
            logs = self.kubectl.kubectl("logs", "-n", self.namespace, pod["metadata"]["name"], "--all-containers",
                                        "--tail", "15", check=False).stdout
            found.append(f"{pod['metadata']['name']}: {states} logs: {logs[-1500:]}")
        return " | ".join(found) or "no pods"

    def _forward(self, target: str, remote_port: int) -> str:
        """A kubectl port-forward to target, started once and reused while it lives."""
        running = self._forwards.get(target)
        if running and running[0].poll() is None:
            return f"http://127.0.0.1:{running[1]}"
        port = free_port()
        process = subprocess.Popen([tool("kubectl") or "kubectl", "--kubeconfig", str(self.cluster.kubeconfig), "-n",
                                    self.namespace, "port-forward", target, f"{port}:{remote_port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._forwards[target] = (process, port)

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_for(f"port-forward to {target}", listening, 30, 0.2)
        return f"http://127.0.0.1:{port}"

    @property
    def router_url(self) -> str:
        """The router Service through port-forward (kubectl picks one ready pod behind it)."""
        return self._forward(f"svc/{RELEASE}-router", 80)

    @property
    def router_headers(self) -> dict[str, str]:
        """The tier's caller's bearer token, made once (`kubectl create token`, for the router's audience)."""
        if not self._caller_token:
            kubectl = self.cluster.kubectl
            kubectl("create", "namespace", CALLER_NAMESPACE, check=False)
            kubectl("create", "serviceaccount", CALLER, "-n", CALLER_NAMESPACE, check=False)
            kubectl("create", "clusterrolebinding", f"{CALLER_NAMESPACE}-call-models",
                    f"--clusterrole=hotset-model-caller-{self.namespace}",
                    f"--serviceaccount={CALLER_NAMESPACE}:{CALLER}", check=False)
            self._caller_token = kubectl("create", "token", CALLER, "-n", CALLER_NAMESPACE, "--audience",
                                         CALLER_AUDIENCE, "--duration", "6h").stdout.strip()
        return {"Authorization": f"Bearer {self._caller_token}"}

    def worker_url(self, pod: str) -> str:
        return self._forward(f"pod/{pod}", 8080)

    def service_url(self, service: str, port: int) -> str:
        return self._forward(f"svc/{service}", port)

    def trust_registry(self, host: str) -> None:
        """A containerd hosts.toml on every node for `host` (plain http): the nodes' default sends
        every other registry to a closed port (e2e/kind/node/files/hosts.toml)."""
        toml = f'server = "http://{host}"\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n'
        for node in self.cluster.nodes():
            run("docker", "exec", "-i", node, "sh", "-c",
                f"mkdir -p /etc/containerd/certs.d/{host} && cat > /etc/containerd/certs.d/{host}/hosts.toml",
                input=toml, timeout=60)

    def kill_container(self, pod: str, container: str) -> None:
        """SIGTERM to the container's PID 1 (the kernel ignores SIGKILL to a namespace's init from inside)."""
        self.cluster.kubectl("exec", "-n", self.namespace, pod, "-c", container, "--", "sh", "-c", "kill -TERM 1",
                             check=False)

    def stop_forwards(self) -> None:
        for process, _ in self._forwards.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=10)
        self._forwards.clear()


def dump(cluster: KindCluster, namespace: str) -> str:
    """Logs, events, describe and object state for a failed kind run."""
    parts = []
    for args in (["get", "nodes,pods,deployments,services", "-A", "-o", "wide"],
                 ["get", "servedmodels", "-A", "-o", "yaml"],
                 ["get", "events", "-A", "--sort-by=.lastTimestamp"],
                 ["describe", "pods", "-n", namespace]):
        done = cluster.kubectl(*args, check=False, timeout=60)
        parts.append(f"$ kubectl {' '.join(args)}\n{(done.stdout + done.stderr)[-12000:]}")
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.split()
    for pod in pods:
        for previous in ([], ["--previous"]):
            done = cluster.kubectl("logs", "-n", namespace, pod, "--all-containers", "--tail=80", *previous, check=False)
            parts.append(f"$ kubectl logs {pod} {' '.join(previous)}\n{done.stdout[-4000:]}")
    return "\n\n".join(parts)
