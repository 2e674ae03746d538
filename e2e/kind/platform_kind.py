"""The whole platform on a kind cluster: real images, real kubelets, the chart.

Creates the cluster (kind-config.yaml, the sample models mounted on each
node), builds the images from Dockerfile.operator and Dockerfile.worker, loads
them into kind, installs the chart (``helm template`` with e2e/kind/values.yaml,
then ``kubectl apply``) and reaches the router and workers through
``kubectl port-forward``. Every process it starts is stopped by pid.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelplane_testing.processes import free_port
from scenarios.chart import RELEASE, REPO, ChartInstall, helm_template_argv
from scenarios.platform import Kube, is_true, models_volume, wait_for

HERE = Path(__file__).resolve().parent
VALUES = HERE / "values.yaml"
CLUSTER = os.environ.get("MODELPLANE_KIND_CLUSTER", "modelplane-e2e")
NAMESPACE = "modelplane"
# The router runs from the control-plane image (Dockerfile.operator) with its own command.
IMAGES = {"modelplane-operator:e2e": "Dockerfile.operator", "modelplane-worker:e2e": "Dockerfile.worker"}
NODE_MODELS_DIR = "/models-src"


def tool(name: str) -> str | None:
    """A tool on PATH, else the venv's (kubectl) or install-k8s.sh's cache (helm)."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in (REPO / ".venv" / "bin" / name,
                      *sorted(Path.home().glob(f".cache/modelplane/k8s-*/bin/{name}"))):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def why_not_runnable() -> str | None:
    """None where the kind tier can run; otherwise what is missing, for the skip message."""
    missing = [name for name in ("docker", "kind", "kubectl", "helm") if tool(name) is None]
    if missing:
        return f"kind e2e tier skipped: {', '.join(missing)} not found (see e2e/kind/README.md)"
    probe = subprocess.run([tool("docker"), "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"kind e2e tier skipped: no Docker engine answers `docker info` ({reason}); see e2e/kind/README.md"
    return None


def run(*argv: str, timeout: float = 1800, input: str | None = None) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


@dataclass
class KindCluster:
    """kubectl against the kind cluster's kubeconfig (the Kubectl interface of scenarios.platform)."""

    kubeconfig: Path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done


def create_cluster(workdir: Path, models_dir: Path) -> KindCluster:
    config = workdir / "kind-config.yaml"
    config.write_text((HERE / "kind-config.yaml").read_text().replace("${MODELS_DIR}", str(models_dir)))
    kubeconfig = workdir / "kubeconfig"
    run(tool("kind"), "create", "cluster", "--name", CLUSTER, "--config", str(config),
        "--kubeconfig", str(kubeconfig), "--wait", "180s", timeout=600)
    return KindCluster(kubeconfig)


def delete_cluster() -> None:
    subprocess.run([tool("kind"), "delete", "cluster", "--name", CLUSTER], capture_output=True, timeout=300)


def build_and_load_images() -> None:
    for tag, dockerfile in IMAGES.items():
        run(tool("docker"), "build", "-f", str(REPO / dockerfile), "-t", tag, str(REPO), timeout=3600)
        run(tool("kind"), "load", "docker-image", tag, "--name", CLUSTER, timeout=900)


@dataclass
class KindPlatform(ChartInstall):
    cluster: KindCluster
    namespace: str = NAMESPACE
    overrides: dict[str, Any] = field(default_factory=dict)
    _forwards: dict[str, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)

    @property
    def kubectl(self) -> KindCluster:
        return self.cluster

    @property
    def kube(self) -> Kube:
        return Kube(self.cluster, self.namespace)

    def prepare(self) -> None:
        self.cluster.kubectl("create", "namespace", self.namespace, check=False)
        self.cluster.kubectl("apply", "-f", "-", input=models_volume(Path(NODE_MODELS_DIR), self.namespace))

    def rendered_manifest(self) -> str:
        return run(*helm_template_argv(tool("helm") or "helm", self.namespace, VALUES, self.overrides), timeout=120)

    def wait_installed(self, timeout: float = 600) -> None:
        for component in ("operator", "router"):
            selector = f"app.kubernetes.io/component={component}"
            wait_for(f"the {component} pod Ready",
                     lambda: any(is_true(p, "Ready") for p in self.kube.items("pods", "-l", selector)), timeout, 2.0)

    def _forward(self, target: str, remote_port: int) -> str:
        """A kubectl port-forward to target, started once and reused while it lives."""
        running = self._forwards.get(target)
        if running and running[0].poll() is None:
            return f"http://127.0.0.1:{running[1]}"
        port = free_port()
        process = subprocess.Popen([tool("kubectl"), "--kubeconfig", str(self.cluster.kubeconfig), "-n", self.namespace,
                                    "port-forward", target, f"{port}:{remote_port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._forwards[target] = (process, port)

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_for(f"port-forward to {target}", listening, 30, 0.2)
        return f"http://127.0.0.1:{port}"

    @property
    def router_url(self) -> str:
        return self._forward(f"svc/{RELEASE}-router", 80)

    def worker_url(self, pod: str) -> str:
        return self._forward(f"pod/{pod}", 8080)

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

