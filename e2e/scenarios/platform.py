"""What a scenario needs from the platform: kubectl, the router's URL, a worker's HTTP API, a way to kill a container.

e2e/kind implements it with a kind cluster and kubectl (port-forward, exec).
Everything else a scenario does goes through kubectl and HTTP, as a user would.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import yaml

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"


class Kubectl(Protocol):
    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]: ...


class Platform(Protocol):
    namespace: str
    kubectl: Kubectl

    @property
    def router_url(self) -> str: ...

    @property
    def router_headers(self) -> dict[str, str]:
        """What a caller sends the router with every request: its bearer token (the chart's
        default checks callers: docs/security.md, "Callers")."""

    def worker_url(self, pod: str) -> str:
        """Base URL of a worker pod's own HTTP API (its /status, /metrics)."""

    def kill_container(self, pod: str, container: str) -> None:
        """Kill one container's main process, as a crash would."""

    def set_pool_size(self, pods: int) -> None:
        """Re-install the chart with a different shared-pool size."""

    def set_memory_budget(self, budget_bytes: int) -> None:
        """Re-install the chart with a different memory budget per worker pod."""

    def set_gpu_mode(self, mode: str) -> None:
        """Re-install the chart with another workers.gpu.mode (devicePlugin, dra or none)."""

    def service_url(self, service: str, port: int) -> str:
        """A URL on this machine that reaches a Service of the namespace (a port-forward)."""

    def trust_registry(self, host: str) -> None:
        """Let every node's container runtime pull from the plain-http registry `host` (host:port)."""


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5,
             show: Callable[[], Any] | None = None) -> Any:
    """Poll check() until truthy; a TimeoutError names what never happened, the last error and show()."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as err:  # noqa: BLE001 - a check may fail until the condition holds
            last_error = err
        time.sleep(interval)
    message = f"timed out after {timeout:.0f}s waiting for {what}"
    if last_error:
        message += f" (last error: {last_error!r})"
    if show is not None:
        try:
            message += f"; state: {show()!r}"[:3000]
        except Exception as err:  # noqa: BLE001 - the state is a courtesy
            message += f"; state unavailable: {err!r}"
    raise TimeoutError(message)


class Kube:
    """kubectl with JSON answers."""

    def __init__(self, runner: Kubectl, namespace: str) -> None:
        self.runner = runner
        self.namespace = namespace

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.runner.kubectl("get", *args, "-n", self.namespace, "-o", "json").stdout)

    def items(self, *args: str) -> list[dict[str, Any]]:
        return self.get(*args).get("items", [])

    def apply_text(self, text: str) -> str:
        return self.runner.kubectl("apply", "-n", self.namespace, "-f", "-", input=text, timeout=120).stdout

    def apply(self, documents: list[dict[str, Any]]) -> str:
        return self.apply_text(yaml.safe_dump_all(documents))

    def delete(self, *args: str) -> None:
        self.runner.kubectl("delete", *args, "-n", self.namespace, "--ignore-not-found", "--wait=false", timeout=120)

    def served_model(self, name: str) -> dict[str, Any]:
        return self.get("servedmodel", name)

    def worker_pods(self, selector: str = "app.kubernetes.io/component=worker") -> list[dict[str, Any]]:
        return [p for p in self.items("pods", "-l", selector) if not p["metadata"].get("deletionTimestamp")]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return {}


def is_true(obj: dict[str, Any], kind: str) -> bool:
    return condition(obj, kind).get("status") == "True"


def sample(name: str) -> dict[str, Any]:
    """A ServedModel from e2e/samples/<name>.yaml."""
    return yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())


def models_volume(models_dir: Path, namespace: str) -> str:
    text = (SAMPLES_DIR / "models-volume.yaml").read_text()
    return text.replace("${MODELS_DIR}", str(models_dir)).replace("${NAMESPACE}", namespace)
