"""One pod bound to one of our nodes: its containers, its status, its end.

A PodRunner thread sets the pod up (address, folders, service-account token,
kubeconfig, volumes), then steps its containers every 200 ms and patches the
pod's status whenever it changes: phase, podIP/hostIP, containerStatuses and
the conditions Initialized, PodReadyToStartContainers, ContainersReady and
Ready (Ready also requires every readiness gate's condition to be True, read
from the pod as others patched it). When the pod is deleted it stops the
processes (SIGTERM, then SIGKILL after the grace period, capped at 10 s) and
finishes the deletion as the kubelet does (delete with grace period 0).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent import kubeapi
from nodeagent.commands import (PodRewriter, UnmappedImage, container_argv, container_mounts,
                                with_bind_host)
from nodeagent.containers import ContainerRunner
from nodeagent.environment import EnvBuilder, host_base
from nodeagent.nodes import NodeConfig, PodAddresses
from nodeagent.volumes import VolumeMaker

log = logging.getLogger("nodeagent.pods")

PODNET = Path(__file__).resolve().parent / "podnet"

STEP_S = 0.2
VOLUME_SYNC_S = 2.0
MAX_GRACE_S = 10.0


@dataclass
class AgentContext:
    """What every pod runner needs from the agent."""

    api: client.ApiClient
    admin_kubeconfig: dict[str, Any]
    state_dir: Path
    venv_bin: Path
    pvc_root: Path | None


def pod_kubeconfig(admin: dict[str, Any], token: str | None, mounted: bool = True) -> dict[str, Any]:
    """The admin kubeconfig's cluster with the pod's own token.

    No token mounted (automountServiceAccountToken: false): no credentials at all.
    A token that could not be issued: the admin's, with a warning in the agent's log.
    """
    context_name = admin.get("current-context")
    context = next(c for c in admin["contexts"] if c["name"] == context_name)["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = next(u for u in admin["users"] if u["name"] == context["user"])
    if not mounted:
        pod_user: dict[str, Any] = {"name": "pod", "user": {}}
    else:
        pod_user = {"name": "pod", "user": {"token": token}} if token else {**user, "name": "pod"}
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{**cluster, "name": "cluster"}],
        "users": [pod_user],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod", "namespace": "default"}}],
    }


class PodRunner(threading.Thread):
    def __init__(self, ctx: AgentContext, node: NodeConfig, addresses: PodAddresses, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.node = node
        self.addresses = addresses
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.pod_dir = ctx.state_dir / "pods" / self.namespace / self.pod_name
        self._core = client.CoreV1Api(ctx.api)
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_grace: float | None = None
        self._delete_when_stopped = False
        self.containers: list[ContainerRunner] = []
        self.pod_ip = ""
        self._pending_reason = ("ContainerCreating", "")
        self._conditions: dict[str, tuple[str, str]] = {}
        self._last_status = ""
        self._start_time = kubeapi.now()
        self._volumes: VolumeMaker | None = None
        self._last_volume_sync = 0.0

    # -- called from the watch thread -----------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self._pod = pod
        self._wake.set()

    def request_stop(self, grace_s: float, delete: bool) -> None:
        with self._lock:
            self._stop_grace = min(grace_s, MAX_GRACE_S)
            self._delete_when_stopped = delete
        self._wake.set()

    # -- the pod's life --------------------------------------------------
    def run(self) -> None:
        ready_to_run = False
        next_try = 0.0
        while self._stop_grace is None:
            now = time.monotonic()
            if not ready_to_run and now >= next_try:
                ready_to_run = self._try_set_up()
                next_try = now + 2.0
            for container in self.containers:
                container.step(now)
            self._sync_volumes(now)
            self._report()
            self._wake.wait(STEP_S)
            self._wake.clear()
        self._tear_down()

    def _try_set_up(self) -> bool:
        """Set the pod up; a failure (e.g. a ConfigMap not there yet) is reported and retried."""
        try:
            self._set_up()
            return True
        except Exception as err:  # noqa: BLE001 - any set-up failure is reported on the pod, as a kubelet would
            log.warning("pod %s/%s set-up failed (retrying): %s", self.namespace, self.pod_name, err)
            self.containers = []
            self._pending_reason = ("ContainerCreating", f"set-up failed: {err}")
            return False

    def _set_up(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        (self.pod_dir / "tmp").mkdir(exist_ok=True)
        self.pod_ip = self.pod_ip or self.addresses.allocate()
        spec = self._pod["spec"]
        mounted = spec.get("automountServiceAccountToken") is not False
        token = self._token(spec) if mounted else None
        kubeconfig_path = self.pod_dir / "kubeconfig"
        kubeconfig_path.write_text(yaml.safe_dump(pod_kubeconfig(self.ctx.admin_kubeconfig, token, mounted)))
        self._volumes = VolumeMaker(self._core, self._pod, self.pod_dir, self.ctx.pvc_root, token or "")
        volume_dirs = self._volumes.make_all(spec.get("volumes") or [])
        base = host_base(self.ctx.venv_bin, self.pod_dir)
        base.update(self._api_env(kubeconfig_path))
        for container in spec.get("containers") or []:
            self.containers.append(self._container(container, volume_dirs, base))
        self._pending_reason = ("", "")

    def _container(self, container: dict[str, Any], volume_dirs: dict[str, Path], base: dict[str, str]) -> ContainerRunner:
        rewrite = PodRewriter(self.pod_ip, container_mounts(container, volume_dirs))
        env = EnvBuilder(self._core, self._pod, self.pod_ip, self.node.host_ip, rewrite).build(container, base)
        # Python processes bind "any"/loopback to the pod IP (see podnet/sitecustomize.py).
        env["MODELPLANE_E2E_POD_IP"] = self.pod_ip
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PODNET), env.get("PYTHONPATH", "")) if p)
        error = ""
        try:
            argv = container_argv(container, env, rewrite, self.ctx.venv_bin)
            argv = with_bind_host(argv, self.pod_ip)
        except UnmappedImage as err:
            argv, error = [], str(err)
        cwd = Path(rewrite(container["workingDir"])) if container.get("workingDir") else self.pod_dir / "tmp"
        return ContainerRunner(container, argv, env, cwd, self.pod_dir, self.pod_ip,
                               self._pod["spec"].get("restartPolicy", "Always"), rewrite, start_error=error)

    def _token(self, spec: dict[str, Any]) -> str | None:
        account = spec.get("serviceAccountName") or "default"
        try:
            return kubeapi.request_token(self._core, self.namespace, account, self._pod)
        except ApiException as err:
            log.warning("no token for service account %s/%s (%s): pod gets admin credentials", self.namespace, account, err.reason)
            return None

    def _api_env(self, kubeconfig_path: Path) -> dict[str, str]:
        server = self.ctx.api.configuration.host
        host_port = server.split("://", 1)[-1].rstrip("/")
        host, _, port = host_port.rpartition(":")
        return {"KUBECONFIG": str(kubeconfig_path), "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port, "KUBERNETES_SERVICE_PORT_HTTPS": port}

    def _sync_volumes(self, now: float) -> None:
        if self._volumes is None or now - self._last_volume_sync < VOLUME_SYNC_S:
            return
        self._last_volume_sync = now
        try:
            self._volumes.refresh()
        except Exception as err:  # noqa: BLE001 - retried at the next sync, as the kubelet does
            log.warning("volume sync of %s/%s failed: %s", self.namespace, self.pod_name, err)

    # -- status ----------------------------------------------------------
    def _report(self) -> None:
        status = self._status()
        text = json.dumps(status, sort_keys=True)
        if text == self._last_status:
            return
        try:
            kubeapi.patch_pod_status(self._core, self.namespace, self.pod_name, status)
            self._last_status = text
        except ApiException as err:
            if err.status == 404:
                self.request_stop(0, delete=False)
            else:
                log.warning("status patch of %s/%s failed: %s", self.namespace, self.pod_name, err.reason)

    def _status(self) -> dict[str, Any]:
        with self._lock:
            pod = self._pod
        statuses = [c.status() for c in self.containers]
        running = any(c.process is not None for c in self.containers)
        containers_ready = bool(self.containers) and all(c.ready for c in self.containers)
        gates_ready, gate_message = self._gates(pod)
        ready = containers_ready and gates_ready
        not_ready = [c.name for c in self.containers if not c.ready]
        self._condition("PodReadyToStartContainers", bool(self.pod_ip) and not self._pending_reason[0])
        self._condition("Initialized", True)
        self._condition("ContainersReady", containers_ready)
        self._condition("Ready", ready)
        conditions = []
        for kind, (value, since) in self._conditions.items():
            entry: dict[str, Any] = {"type": kind, "status": value, "lastTransitionTime": since, "lastProbeTime": None}
            if kind in ("ContainersReady", "Ready") and value == "False":
                entry["reason"] = "ContainersNotReady" if not containers_ready else "ReadinessGatesNotReady"
                entry["message"] = f"containers with unready status: {not_ready}" if not containers_ready else gate_message
            conditions.append(entry)
        finished = self.containers and all(c.finished for c in self.containers)
        if finished:
            phase = "Succeeded" if all(c.last_state.get("terminated", {}).get("exitCode") == 0 for c in self.containers) else "Failed"
        else:
            phase = "Running" if running else "Pending"
        status: dict[str, Any] = {
            "phase": phase, "hostIP": self.node.host_ip, "hostIPs": [{"ip": self.node.host_ip}],
            "startTime": self._start_time, "conditions": conditions, "containerStatuses": statuses,
        }
        if self.pod_ip:
            status.update(podIP=self.pod_ip, podIPs=[{"ip": self.pod_ip}])
        # null removes a reason reported earlier (strategic merge patch)
        status["reason"], status["message"] = self._pending_reason if self._pending_reason[0] else (None, None)
        return status

    def _condition(self, kind: str, value: bool) -> None:
        text = "True" if value else "False"
        if self._conditions.get(kind, ("", ""))[0] != text:
            self._conditions[kind] = (text, kubeapi.now())

    @staticmethod
    def _gates(pod: dict[str, Any]) -> tuple[bool, str]:
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        current = {c["type"]: c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        missing = [g for g in gates if current.get(g) != "True"]
        return not missing, f"corresponding condition of pod readiness gate {missing} does not exist or is not True"

    # -- the end ---------------------------------------------------------
    def _tear_down(self) -> None:
        grace = self._stop_grace or 0.0
        for container in self.containers:
            container.stop(grace)
        log.info("pod %s/%s stopped", self.namespace, self.pod_name)
        if self._delete_when_stopped:
            self._finish_delete()

    def _finish_delete(self) -> None:
        """The kubelet's last word: delete with grace 0 once the containers are gone."""
        try:
            self._core.delete_namespaced_pod(self.pod_name, self.namespace, grace_period_seconds=0,
                                             body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
            log.info("pod %s/%s deleted", self.namespace, self.pod_name)
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("final delete of %s/%s failed: %s", self.namespace, self.pod_name, err.reason)
        except Exception:  # noqa: BLE001 - reported, the pod then stays Terminating for a human to see
            log.exception("final delete of %s/%s failed", self.namespace, self.pod_name)
