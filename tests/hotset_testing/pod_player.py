"""A stand-in kubelet for autoscaling tests and benchmarks (test infrastructure, not product code).

The real control plane of ``kube_cluster`` has no kubelet: pods are created by
the real controller-manager and bound by the real scheduler to a Node the
player registers, but nothing runs them. The player does, for worker pods:

- a pod bound to its node gets a real ``hotset-worker`` process serving
  the test-only ballast framework (``tests/router/ballast_worker_main.py``),
  on a loopback address of its own (127.0.x.y, the pod IP) and the one worker
  port, with the pod's own settings from its environment: the operator's
  catalog feed it follows (``HOTSET_CATALOG_URL``), pinned models and memory
  budget;
- once the worker answers ``/v2/health/ready``, the pod's status says
  Running and Ready with that IP (a kubelet's status update);
- a pod being deleted gets SIGTERM (the worker drains), then its Pod object
  goes (``grace_period_seconds=0``, what a kubelet confirms);
- the worker container's projected ServiceAccount tokens are minted with the
  TokenRequest API bound to the Pod (its name and uid), for each source's
  audience and lifetime, as a kubelet mints them, and its ConfigMap volumes
  are written from their ConfigMaps (again every few seconds, as a kubelet's
  sync does; an optional one that does not exist yet is an empty folder): the
  files land in a folder per pod, and the pod's variables naming a path
  under a mount name the same file there.

``namespace`` limits it to one namespace's pods (the session's tests share
one Node name). ``start_delay_s`` stands for image pull and container start, which this
machine does not have. What it does not emulate: probes after the first
readiness, restarts, resource limits, rotating a token before it expires.
"""
from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotset_testing import processes
from hotset_testing.kube_cluster import KubeCluster, register_node

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
BALLAST_LAUNCHER = [sys.executable, str(ROOT / "tests" / "router" / "ballast_worker_main.py")]
SELECTOR = "app.kubernetes.io/part-of=hotset,app.kubernetes.io/component=worker"


@dataclass
class PlayedPod:
    namespace: str
    name: str
    ip: str
    process: processes.Process | None = None
    ready_at: float = 0.0
    started_at: float = field(default_factory=time.monotonic)


def _bindable(ip: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((ip, port))
        except OSError:
            return False
    return True


class PodPlayer:
    """Runs the worker pods bound to one Node as local processes; ``with PodPlayer(...) as player:``."""

    def __init__(self, cluster: KubeCluster, workdir: Path, port: int, source_root: Path, node: str = "node-a",
                 start_delay_s: float = 0.0, first_ip: str = "127.0.60.1", extra_args: tuple[str, ...] = (),
                 namespace: str | None = None) -> None:
        from kubernetes import client, config

        self.cluster = cluster
        self.workdir = workdir
        self.port = port
        self.source_root = source_root
        self.node = node
        self.start_delay_s = start_delay_s
        self.extra_args = extra_args
        # The session's one Node name is shared by every test: an earlier test's pods (its namespace
        # still being deleted) are bound to it too, and are not this player's to run or count.
        self.namespace = namespace
        self._api = config.new_client_from_config(str(cluster.kubeconfig))
        self._core = client.CoreV1Api(self._api)
        self._next_ip = ipaddress.IPv4Address(first_ip)
        self._pods: dict[tuple[str, str], PlayedPod] = {}
        self._config_maps: dict[tuple[str, str], list[tuple[str, Path]]] = {}  # pod -> (ConfigMap, folder)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: Any = None
        self._cordoned: list[str] = []
        self.events: list[tuple[float, str, str]] = []  # (monotonic time, "ready"/"gone", pod name)

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "PodPlayer":
        register_node(self.cluster, self.node, cpu="64", memory="256Gi", gpus=64)
        self._heartbeat()
        # Other tests of the session leave Nodes with no kubelet behind them; the scheduler spreads
        # pods over every Ready node, so a pod bound there would never run. Cordoned while this plays.
        self._cordoned = self._cordon_others()
        for target in (self._watch_pods, self._heartbeats):
            thread = threading.Thread(target=target, name=f"pod-player-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            played = list(self._pods.values())
        for pod in played:
            if pod.process is not None:
                pod.process.stop(10)
        for node in self._cordoned:
            self.cluster.kubectl("uncordon", node, check=False)
        self._api.close()

    def _cordon_others(self) -> list[str]:
        """Cordon every other schedulable Node; returns their names (uncordoned on exit)."""
        others = [n.metadata.name for n in self._core.list_node().items
                  if n.metadata.name != self.node and not n.spec.unschedulable]
        for node in others:
            self.cluster.kubectl("cordon", node)
        return others

    # --- what tests read -----------------------------------------------------------------

    def running(self) -> list[str]:
        """Names of the pods whose worker answers now."""
        with self._lock:
            return sorted(p.name for p in self._pods.values() if p.ready_at and p.process and p.process.alive())

    def url_of(self, name: str) -> str:
        with self._lock:
            pod = next(p for p in self._pods.values() if p.name == name)
        return f"http://{pod.ip}:{self.port}"

    # --- the kubelet's part ----------------------------------------------------------------

    def _allocate_ip(self) -> str:
        while True:
            ip = str(self._next_ip)
            self._next_ip += 1
            if _bindable(ip, self.port):
                return ip

    def _watch_pods(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                self._watch = watch.Watch()
                listing = ((self._core.list_namespaced_pod, self.namespace) if self.namespace
                           else (self._core.list_pod_for_all_namespaces,))
                for event in self._watch.stream(*listing, label_selector=SELECTOR,
                                                field_selector=f"spec.nodeName={self.node}", timeout_seconds=60):
                    self._on_pod(event["type"], event["object"])
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a watch that ends is restarted, as the kubelet's is
                if not self._stop.is_set():
                    log.info("pod watch ended: %s", exc)  # e.g. 504 "Too large resource version" while the cache warms
                    self._stop.wait(0.5)

    def _on_pod(self, kind: str, pod: Any) -> None:
        key = (pod.metadata.namespace, pod.metadata.name)
        with self._lock:
            known = self._pods.get(key)
        if kind == "DELETED":
            if known is not None:
                self._terminate(known, delete=False)
            return
        if pod.metadata.deletion_timestamp is not None:
            if known is not None:
                threading.Thread(target=self._terminate, args=(known,), daemon=True).start()
            else:
                self._delete(key)
            return
        if known is None:
            played = self._admit(pod)
            threading.Thread(target=self._start, args=(played, pod), daemon=True).start()

    def _admit(self, pod: Any) -> PlayedPod:
        with self._lock:
            played = PlayedPod(pod.metadata.namespace, pod.metadata.name, self._allocate_ip())
            self._pods[(played.namespace, played.name)] = played
        return played

    def _env(self, pod: Any) -> dict[str, str]:
        worker = pod.spec.containers[0]
        return {e.name: e.value or "" for e in worker.env or [] if e.value is not None}

    def _volumes(self, played: PlayedPod, pod: Any) -> dict[str, str]:
        """The kubelet's part for the worker container's token and ConfigMap volumes (module
        docstring); returns the identity variables of the pod (worker_settings), with their paths
        where this player put the files."""
        from hotset_common.worker_settings import WorkerOption

        root = self.workdir / f"{played.namespace}-{played.name}-volumes"
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        for mount in pod.spec.containers[0].volume_mounts or []:
            volume = volumes.get(mount.name)
            folder = root / mount.name
            if volume is not None and volume.projected is not None:
                for source in volume.projected.sources or []:
                    if source.service_account_token is not None:
                        try:
                            token = self._token(pod, source.service_account_token)
                        except Exception as exc:  # a kubelet would not start it; here it cannot prove itself
                            log.warning("no token for pod %s: %s", played.name, exc)
                            continue
                        _write(folder / source.service_account_token.path, token)
                mounts[mount.mount_path] = folder
            elif volume is not None and volume.config_map is not None:
                folder.mkdir(parents=True, exist_ok=True)
                with self._lock:
                    self._config_maps.setdefault((played.namespace, played.name), []).append(
                        (volume.config_map.name, folder))
                mounts[mount.mount_path] = folder
        self._sync_config_maps()
        identity = (WorkerOption.CALLER_KEYS, WorkerOption.TRUSTED_CALLERS, WorkerOption.IDENTITY_TOKEN_FILE,
                    WorkerOption.CATALOG_TOKEN_FILE)
        env = {name: value for name, value in self._env(pod).items() if name in {o.env for o in identity}}
        for name, value in env.items():
            for path, folder in mounts.items():
                if value == path or value.startswith(path.rstrip("/") + "/"):
                    env[name] = str(folder / value[len(path):].lstrip("/"))
        return env

    def _token(self, pod: Any, source: Any) -> str:
        """A ServiceAccount token bound to `pod`, as the kubelet asks for one (TokenRequest)."""
        from kubernetes import client

        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[source.audience] if source.audience else None,
            expiration_seconds=source.expiration_seconds or 3600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name,
                                                           uid=pod.metadata.uid)))
        account = pod.spec.service_account_name or "default"
        return self._core.create_namespaced_service_account_token(account, pod.metadata.namespace, request).status.token

    def _sync_config_maps(self) -> None:
        """Each played pod's ConfigMap volumes, from their ConfigMaps now (absent: left as they are)."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            wanted = [(key[0], name, folder) for key, found in self._config_maps.items() for name, folder in found]
        for namespace, name, folder in wanted:
            try:
                data = self._core.read_namespaced_config_map(name, namespace).data or {}
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            for key, value in data.items():
                target = folder / key
                if not target.exists() or target.read_text() != value:
                    _write(target, value)

    def _start(self, played: PlayedPod, pod: Any) -> None:
        if self._stop.wait(self.start_delay_s):
            return
        env = self._env(pod)
        identity = self._volumes(played, pod)
        argv = [*BALLAST_LAUNCHER, "--catalog-url", env["HOTSET_CATALOG_URL"], "--host", played.ip, "--port", str(self.port),
                "--memory-budget", env.get("HOTSET_MEMORY_BUDGET", "1Gi"), "--pod-name", played.name,
                "--pinned", env.get("HOTSET_PINNED_MODELS", ""), "--triton-url", "",
                "--source-root", f"models={self.source_root}", "--min-residency-s", "0", *self.extra_args]
        process = processes.spawn(played.name, argv, self.workdir / f"{played.namespace}-{played.name}.log",
                                  env=identity, url=f"http://{played.ip}:{self.port}")
        with self._lock:
            # A pod deleted (or a player stopped) while this one started found no process to stop.
            wanted = not self._stop.is_set() and self._pods.get((played.namespace, played.name)) is played
            if wanted:
                played.process = process
        if not wanted:
            process.stop(10)
            return
        try:
            processes.wait_http(process, "/v2/health/ready", 120)
        except Exception as exc:  # a worker that never gets ready stays unready, as a pod would
            log.warning("pod %s never got ready: %s", played.name, exc)
            return
        self._core.patch_namespaced_pod_status(played.name, played.namespace, {"status": {
            "phase": "Running", "podIP": played.ip, "podIPs": [{"ip": played.ip}], "hostIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"},
                           {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}],
        }})
        played.ready_at = time.monotonic()
        self.events.append((played.ready_at, "ready", played.name))

    def _terminate(self, played: PlayedPod, delete: bool = True) -> None:
        with self._lock:
            self._config_maps.pop((played.namespace, played.name), None)
            if self._pods.pop((played.namespace, played.name), None) is None:
                return
        if played.process is not None:
            played.process.stop(30)
        self.events.append((time.monotonic(), "gone", played.name))
        if delete:
            self._delete((played.namespace, played.name))

    def _delete(self, key: tuple[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- the node's heartbeat ----------------------------------------------------------------

    def _heartbeat(self) -> None:
        """What a kubelet renews: without it the node lifecycle controller marks the node NotReady
        after its grace period (about 40 s) and every pod on it unready."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        self._core.patch_node_status(self.node, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the pod player is up",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}})
        leases = client.CoordinationV1Api(self._api)
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        try:
            leases.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": spec},
                                          _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status != 404:
                raise
            leases.create_namespaced_lease("kube-node-lease", {"metadata": {"name": self.node}, "spec": spec})

    def _heartbeats(self) -> None:
        while not self._stop.wait(5.0):
            try:
                self._heartbeat()
                self._sync_config_maps()
            except Exception as exc:  # the next beat tries again
                log.warning("node heartbeat: %s", exc)


def _write(path: Path, text: str) -> None:
    """Write a file whole, as the kubelet's atomic writer does (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    partial.replace(path)
