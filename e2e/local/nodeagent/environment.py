"""A container's environment, as the kubelet would build it.

Order: a small host base (PATH with the venv first, HOME, offline flags,
OMP_NUM_THREADS=1 because the test machine has two cores), the API server's
address and a per-pod KUBECONFIG (there is no /var/run/secrets here, so
clients fall back to KUBECONFIG), then the pod spec's ``envFrom`` and ``env``
in order with $(VAR) expansion and the downward API (fieldRef,
resourceFieldRef), ConfigMap and Secret references read from the API server.
Values from the pod spec go through the PodRewriter (see commands.py).
"""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Callable

from kubernetes import client

from nodeagent.commands import expand_vars


def host_base(venv_bin: Path, pod_dir: Path) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TZ") if k in os.environ}
    return {
        **keep,
        "PATH": os.pathsep.join([str(venv_bin), "/usr/local/bin", "/usr/bin", "/bin"]),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TMPDIR": str(pod_dir / "tmp"),
    }


def field_ref(pod: dict[str, Any], path: str, pod_ip: str, host_ip: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return simple[path]
    for prefix, source in (("metadata.labels", meta.get("labels") or {}), ("metadata.annotations", meta.get("annotations") or {})):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return source.get(path[len(prefix) + 2:-2], "")
    raise ValueError(f"unsupported fieldRef {path!r}")


def resource_ref(container: dict[str, Any], ref: dict[str, Any]) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    return str(value) if value is not None else {"cpu": "16", "memory": str(64 * 2**30)}.get(name, "0")


class EnvBuilder:
    """Builds one container's environment; ConfigMaps/Secrets come from the API."""

    def __init__(self, core: client.CoreV1Api, pod: dict[str, Any], pod_ip: str, host_ip: str,
                 rewrite: Callable[[str], str]) -> None:
        self._core = core
        self._pod = pod
        self._pod_ip = pod_ip
        self._host_ip = host_ip
        self._rewrite = rewrite
        self._namespace = pod["metadata"]["namespace"]

    def build(self, container: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        for source in container.get("envFrom") or []:
            env.update({(source.get("prefix") or "") + k: self._rewrite(v) for k, v in self._env_from(source).items()})
        for var in container.get("env") or []:
            value = self._value(container, var, env)
            if value is not None:
                env[var["name"]] = value
        return env

    def _value(self, container: dict[str, Any], var: dict[str, Any], env: dict[str, str]) -> str | None:
        if "valueFrom" not in var:
            return self._rewrite(expand_vars(var.get("value", ""), env))
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            return field_ref(self._pod, ref["fieldRef"]["fieldPath"], self._pod_ip, self._host_ip)
        if "resourceFieldRef" in ref:
            return resource_ref(container, ref["resourceFieldRef"])
        if "configMapKeyRef" in ref:
            data = self._config_map(ref["configMapKeyRef"]["name"])
            return self._rewrite(data[ref["configMapKeyRef"]["key"]]) if ref["configMapKeyRef"]["key"] in data else None
        if "secretKeyRef" in ref:
            data = self._secret(ref["secretKeyRef"]["name"])
            return data.get(ref["secretKeyRef"]["key"])
        raise ValueError(f"unsupported valueFrom {sorted(ref)} in env {var['name']!r}")

    def _env_from(self, source: dict[str, Any]) -> dict[str, str]:
        if "configMapRef" in source:
            return self._config_map(source["configMapRef"]["name"])
        if "secretRef" in source:
            return self._secret(source["secretRef"]["name"])
        return {}

    def _config_map(self, name: str) -> dict[str, str]:
        return dict(self._core.read_namespaced_config_map(name, self._namespace).data or {})

    def _secret(self, name: str) -> dict[str, str]:
        data = self._core.read_namespaced_secret(name, self._namespace).data or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}
