"""Pod volumes as host folders, shared by the pod's containers.

- emptyDir: a fresh folder under the pod's state folder;
- hostPath: the path itself;
- persistentVolumeClaim: the hostPath (or local path) of the PersistentVolume
  the claim is bound to; else ``<pvc root>/<claimName>`` (the agent's --pvc-root);
- configMap / secret: a folder holding one file per key (items honoured);
- projected: the sources above plus serviceAccountToken, merged into one folder.

Like the kubelet, ConfigMap and Secret contents are kept in sync while the pod
runs (``refresh()``, called every few seconds): changed keys are rewritten
atomically, so a process that re-reads its config file sees the update.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException


class VolumeError(Exception):
    """A volume this agent cannot provide (the pod then stays ContainerCreating)."""


class VolumeMaker:
    def __init__(self, core: client.CoreV1Api, pod: dict[str, Any], pod_dir: Path, pvc_root: Path | None,
                 token: str) -> None:
        self._core = core
        self._namespace = pod["metadata"]["namespace"]
        self._pod_dir = pod_dir
        self._pvc_root = pvc_root
        self._token = token
        self._synced: list[dict[str, Any]] = []

    def make_all(self, volumes: list[dict[str, Any]]) -> dict[str, Path]:
        self._synced = [v for v in volumes if {"configMap", "secret", "projected"} & set(v)]
        return {volume["name"]: self.make(volume) for volume in volumes}

    def refresh(self) -> None:
        """Re-read ConfigMap/Secret-backed volumes and rewrite what changed."""
        for volume in self._synced:
            self.make(volume)

    def make(self, volume: dict[str, Any]) -> Path:
        name = volume["name"]
        folder = self._pod_dir / "volumes" / name
        if "emptyDir" in volume:
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        if "hostPath" in volume:
            return Path(volume["hostPath"]["path"])
        if "persistentVolumeClaim" in volume:
            return self._claim_folder(volume["persistentVolumeClaim"]["claimName"])
        if "configMap" in volume:
            data = self._config_map(volume["configMap"]["name"], bool(volume["configMap"].get("optional")))
            return self._write(folder, data, volume["configMap"].get("items"))
        if "secret" in volume:
            data = self._secret(volume["secret"]["secretName"])
            return self._write(folder, data, volume["secret"].get("items"))
        if "projected" in volume:
            return self._projected(folder, volume["projected"].get("sources") or [])
        raise VolumeError(f"volume {name!r}: unsupported kind {sorted(k for k in volume if k != 'name')}")

    def _projected(self, folder: Path, sources: list[dict[str, Any]]) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for source in sources:
            if "serviceAccountToken" in source:
                self._write(folder, {source["serviceAccountToken"].get("path", "token"): self._token}, None)
            elif "configMap" in source:
                data = self._core.read_namespaced_config_map(source["configMap"]["name"], self._namespace).data or {}
                self._write(folder, data, source["configMap"].get("items"))
            elif "secret" in source:
                self._write(folder, self._secret(source["secret"]["name"]), source["secret"].get("items"))
            elif "downwardAPI" in source:
                self._write(folder, {"namespace": self._namespace}, None)
        return folder

    def _claim_folder(self, claim: str) -> Path:
        bound = self._core.read_namespaced_persistent_volume_claim(claim, self._namespace).spec.volume_name
        if bound:
            volume = self._core.read_persistent_volume(bound).spec
            source = volume.host_path or volume.local
            if source is not None and Path(source.path).exists():
                return Path(source.path)
        if self._pvc_root is not None and (self._pvc_root / claim).exists():
            return self._pvc_root / claim
        raise VolumeError(f"claim {claim!r} is bound to no hostPath/local volume here and {self._pvc_root}/{claim} does not exist")

    def _config_map(self, name: str, optional: bool) -> dict[str, str]:
        try:
            return dict(self._core.read_namespaced_config_map(name, self._namespace).data or {})
        except ApiException as err:
            if err.status == 404 and optional:
                return {}
            if err.status == 404:
                raise VolumeError(f"configmap {name!r} not found") from err
            raise

    def _secret(self, name: str) -> dict[str, str]:
        data = self._core.read_namespaced_secret(name, self._namespace).data or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    @staticmethod
    def _write(folder: Path, data: dict[str, str], items: list[dict[str, Any]] | None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        chosen = {item["key"]: item.get("path", item["key"]) for item in items} if items else {k: k for k in data}
        for key, rel in chosen.items():
            if key in data:
                target = folder / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists() and target.read_text() == data[key]:
                    continue
                staging = target.with_name(f".{target.name}.tmp")
                staging.write_text(data[key])
                staging.replace(target)
        return folder
