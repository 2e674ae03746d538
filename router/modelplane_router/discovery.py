"""Where the worker pods are, and what each model's spec says (min/max copies, memory).

Standalone: a fixed list of worker URLs and, optionally, the model store JSON
the workers read. Cluster: the Kubernetes API, watched with the kubernetes
client's ``watch.Watch`` (worker pods by label selector, ready condition and
pod IP; ServedModel objects). Both expose the same small interface to the
rest of the router: ``urls()``, ``node_of(url)``, ``spec_of(model)``.

Cluster mode's watches run in threads while the router's event loop reads
what they found: every change replaces the whole table under a lock (readers
get a snapshot, never a dict being changed), a restarted watch swaps in its
fresh listing at once (the table is never empty in between), and every call
to the API server has a timeout (a watch that hears nothing for
``watch_timeout_s`` ends on the server and, should the connection be
half-open, on the client too), so discovery cannot freeze.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Iterable, Protocol

from modelplane_common import labels
from modelplane_common import spec as spec_module
from modelplane_common.spec import ModelSpec

log = logging.getLogger(__name__)


class Discovery(Protocol):
    def urls(self) -> list[str]: ...
    def node_of(self, url: str) -> str: ...
    def pool_of(self, url: str) -> str: ...
    def spec_of(self, model: str) -> ModelSpec | None: ...
    def specs(self) -> list[ModelSpec]: ...


def read_model_store(path: Path) -> dict[str, ModelSpec]:
    """Specs from a model store JSON (``{"models": [...]}`` or a list); bad entries are skipped with a log line."""
    raw = json.loads(path.read_text())
    entries = raw.get("models", []) if isinstance(raw, dict) else raw
    specs: dict[str, ModelSpec] = {}
    for entry in entries:
        entry = dict(entry)
        source = entry.get("source")
        if isinstance(source, dict):
            entry["source"] = source.get("uri", "")
        if isinstance(entry.get("source"), str) and "://" not in entry["source"]:
            entry["source"] = "file://" + str((path.parent / entry["source"]).resolve())
        if "task" not in entry and "type" in entry:
            entry["task"] = entry["type"]
        try:
            model = ModelSpec.model_validate(entry)
        except ValueError as exc:
            log.warning("model store %s: skipping %r: %s", path, entry.get("id"), exc)
            continue
        specs[model.id] = model
    return specs


class StaticDiscovery:
    """A fixed list of worker URLs (standalone mode)."""

    def __init__(self, urls: Iterable[str], specs: dict[str, ModelSpec] | None = None) -> None:
        self._urls = [u.rstrip("/") for u in urls if u.strip()]
        self._specs = dict(specs or {})

    def urls(self) -> list[str]:
        return list(self._urls)

    def node_of(self, url: str) -> str:
        return ""

    def pool_of(self, url: str) -> str:
        return ""

    def spec_of(self, model: str) -> ModelSpec | None:
        return self._specs.get(model)

    def specs(self) -> list[ModelSpec]:
        return list(self._specs.values())


def pod_url(pod: Any, port: int) -> str | None:
    """``http://<pod IP>:<port>`` for a running, ready pod; None otherwise."""
    status = pod.status
    if status is None or not status.pod_ip or pod.metadata.deletion_timestamp is not None:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
    return f"http://{status.pod_ip}:{port}" if ready else None


class KubeDiscovery:
    """Worker pods and ServedModels from the Kubernetes API, kept current by watches in threads."""

    def __init__(self, namespace: str, label_selector: str, worker_port: int, api_client: Any = None,
                 watch_timeout_s: float = 300.0, request_timeout_s: float = 30.0) -> None:
        from kubernetes import client  # imported here: standalone mode needs no kubernetes package

        self.namespace = namespace
        self.label_selector = label_selector
        self.worker_port = worker_port
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        # Replaced whole (copy on write) under the lock; readers use the reference they got.
        self._pods: dict[str, tuple[str, str, str]] = {}  # pod name -> (url, node, labels.pool_of)
        self._specs: dict[str, ModelSpec] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}  # the current watch of each thread

    # --- interface ---------------------------------------------------------------------
    def urls(self) -> list[str]:
        return sorted(url for url, _, _ in self._pods.values())

    def node_of(self, url: str) -> str:
        return next((node for u, node, _ in self._pods.values() if u == url), "")

    def pool_of(self, url: str) -> str:
        """The pod's pool from its labels: "shared", ``labels.dedicated_pool(model)``, or ""."""
        return next((pool for u, _, pool in self._pods.values() if u == url), "")

    def spec_of(self, model: str) -> ModelSpec | None:
        return self._specs.get(model)

    def specs(self) -> list[ModelSpec]:
        return list(self._specs.values())

    def _timeouts(self) -> dict[str, Any]:
        """A list's client-side timeout; a watch adds its server-side one (see the module docstring)."""
        return {"_request_timeout": (self.request_timeout_s, self.request_timeout_s)}

    def _watch_timeouts(self) -> dict[str, Any]:
        return {"timeout_seconds": int(self.watch_timeout_s),
                "_request_timeout": (self.request_timeout_s, self.watch_timeout_s + self.request_timeout_s)}

    # --- watches ---------------------------------------------------------------------------
    def start(self) -> None:
        for target in (self._watch_pods, self._watch_served_models):
            thread = threading.Thread(target=self._forever, args=(target,), daemon=True, name=target.__name__)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()

    def _forever(self, target: Any) -> None:
        while not self._stop.is_set():
            try:
                target()
            except Exception as exc:  # a watch that ends or fails is restarted (410 Gone included)
                log.warning("watch %s ended: %s; restarting", target.__name__, exc)
                self._stop.wait(1.0)

    def _pod_entry(self, pod: Any) -> tuple[str, str, str] | None:
        url = pod_url(pod, self.worker_port)
        return None if url is None else (url, pod.spec.node_name or "", labels.pool_of(pod.metadata.labels or {}))

    def apply_pod_event(self, kind: str, pod: Any) -> None:
        entry = self._pod_entry(pod) if kind != "DELETED" else None
        with self._lock:
            pods = dict(self._pods)
            if entry is None:
                pods.pop(pod.metadata.name, None)
            else:
                pods[pod.metadata.name] = entry
            self._pods = pods

    def _spec_entry(self, body: dict[str, Any]) -> ModelSpec | None:
        try:
            return ModelSpec.from_served_model(body)
        except ValueError as exc:
            log.warning("ServedModel %s ignored: %s", body.get("metadata", {}).get("name", ""), exc)
            return None

    def apply_served_model_event(self, kind: str, body: dict[str, Any]) -> None:
        name = body.get("metadata", {}).get("name", "")
        spec = self._spec_entry(body) if kind != "DELETED" else None
        with self._lock:
            specs = dict(self._specs)
            if spec is None:
                specs.pop(name, None)
            else:
                specs[name] = spec
            self._specs = specs

    def _watch_pods(self) -> None:
        from kubernetes import watch

        listing = self._core.list_namespaced_pod(self.namespace, label_selector=self.label_selector, **self._timeouts())
        fresh = {pod.metadata.name: entry for pod in listing.items if (entry := self._pod_entry(pod)) is not None}
        with self._lock:
            self._pods = fresh  # swapped whole: never empty while the watch restarts
        w = self._watches["pods"] = watch.Watch()
        for event in w.stream(
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=self.label_selector,
            resource_version=listing.metadata.resource_version,
            **self._watch_timeouts(),
        ):
            self.apply_pod_event(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()

    def _watch_served_models(self) -> None:
        from kubernetes import watch

        args = (spec_module.GROUP, spec_module.VERSION, self.namespace, spec_module.PLURAL)
        listing = self._custom.list_namespaced_custom_object(*args, **self._timeouts())
        fresh = {item["metadata"]["name"]: spec for item in listing.get("items", [])
                 if (spec := self._spec_entry(item)) is not None}
        with self._lock:
            self._specs = fresh
        w = self._watches["servedmodels"] = watch.Watch()
        for event in w.stream(
            self._custom.list_namespaced_custom_object,
            *args,
            resource_version=listing.get("metadata", {}).get("resourceVersion"),
            **self._watch_timeouts(),
        ):
            self.apply_served_model_event(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()
