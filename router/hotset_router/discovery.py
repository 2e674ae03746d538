"""Where the worker pods are, and what each model's spec says (min/max copies, memory).

Standalone: a fixed list of worker URLs and, optionally, the model store JSON
the workers read. Cluster: the Kubernetes API, watched with the kubernetes
client's ``watch.Watch`` (worker pods by label selector, ready condition and
pod IP, counted only when one of the operator's Deployments owns them:
hotset_common.worker_ownership, from watches of the worker-labelled
ReplicaSets and the operator's Deployments; ServedModel objects; ModelQuotas, for each namespace's request rate,
``rate_of(namespace)``, and weight, ``weight_of(namespace)``), in one namespace, a list of them, or all. Both
expose the same small interface to the rest of the router: ``urls()``,
``node_of(url)``, ``spec_of(model)``, ``draining(url)``, and
``take_changed_specs()`` (the models whose spec changed since the last
call: the copy loop looks at those, not at every model). Lookups by URL and
by model name are dict lookups (the request path and the copy loop make
them per model).

Cluster mode's watches run in threads while the router's event loop reads
what they found: every change replaces the whole table under a lock (readers
get a snapshot, never a dict being changed), a restarted watch swaps in its
fresh listing at once (the table is never empty in between), and every call
to the API server has a timeout (a watch that hears nothing for
``watch_timeout_s`` ends on the server and, should the connection be
half-open, on the client too), so discovery cannot freeze.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from hotset_common import labels, model_store
from hotset_common import spec as spec_module
from hotset_common import worker_ownership as ownership
from hotset_common.spec import DEFAULT_SERVING_WEIGHT, ModelSpec, RequestRate, ServingTerms
from hotset_common.worker_identity import PodIdentity
from hotset_common.worker_ownership import PodClaim, WorkerTrust

log = logging.getLogger(__name__)


class Discovery(Protocol):
    def urls(self) -> list[str]: ...
    def node_of(self, url: str) -> str: ...
    def pool_of(self, url: str) -> str: ...
    def spec_of(self, model: str) -> ModelSpec | None: ...
    def specs(self) -> list[ModelSpec]: ...
    def draining(self, url: str) -> bool: ...
    def take_changed_specs(self) -> set[str]: ...


def identity_of(discovery: Discovery, url: str) -> PodIdentity | None:
    """Which pod the cluster says is at `url` (cluster mode); None: no pod (standalone mode)."""
    find = getattr(discovery, "identity_of", None)
    return find(url) if find is not None else None


def read_model_store(path: Path) -> dict[str, ModelSpec]:
    """Specs from a model store JSON, read exactly as the workers read it (hotset_common.model_store):
    a file the workers refuse is refused here too, naming the model and the field."""
    return {spec.id: spec for spec in model_store.read_file(path)}


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

    def draining(self, url: str) -> bool:
        return False

    def take_changed_specs(self) -> set[str]:
        return set()  # fixed at start; the copy loop's first pass looks at every model anyway


def pod_url(pod: Any, port: int) -> str | None:
    """``http://<pod IP>:<port>`` for a running, ready pod; None otherwise."""
    status = pod.status
    if status is None or not status.pod_ip or pod.metadata.deletion_timestamp is not None:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
    return f"http://{status.pod_ip}:{port}" if ready else None


ALL_NAMESPACES = "*"
QUOTA_PLURAL = "modelquotas"
QUOTA_CRD_RETRY_S = 30.0  # no ModelQuota CRD installed: look again this often


@dataclass(frozen=True)
class _Pod:
    url: str
    node: str
    pool: str  # labels.pool_of
    draining: bool  # the operator's drain annotation: no new copies, requests move off
    identity: PodIdentity | None = None  # namespace, name and uid: what its identity token must be bound to


def pod_claim(pod: Any) -> PodClaim:
    """Who a kubernetes-client V1Pod says made it (its controller ownerReference) and its labels."""
    meta = pod.metadata
    refs = [{"kind": r.kind, "name": r.name, "uid": r.uid, "controller": r.controller}
            for r in meta.owner_references or ()]
    return PodClaim.of({"ownerReferences": refs, "labels": meta.labels or {}})


@dataclass(frozen=True)
class _Model:
    spec: ModelSpec
    namespace: str
    accepted: bool  # the operator's Accepted condition: a refused duplicate name never wins
    created: str


def _accepted(body: dict[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Accepted" and c.get("status") == "True" for c in conditions)


class KubeDiscovery:
    """Worker pods and ServedModels from the Kubernetes API, kept current by watches in threads.

    `namespaces`: where to watch (default: `namespace` alone; ``["*"]``: every namespace). Model
    names are what clients send, so they are one namespace across the watched ones: where two
    ServedModels share a name, the one the operator accepted wins (the operator refuses the later).
    `trust`: OWNED (the default) counts a labelled pod only when one of the operator's Deployments
    owns it; LABELLED counts every labelled pod (workers the operator did not make, test stand-ins).
    """

    def __init__(self, namespace: str, label_selector: str, worker_port: int, api_client: Any = None,
                 namespaces: Sequence[str] | None = None, watch_timeout_s: float = 300.0,
                 request_timeout_s: float = 30.0, trust: WorkerTrust = WorkerTrust.OWNED) -> None:
        from kubernetes import client  # imported here: standalone mode needs no kubernetes package

        self.namespace = namespace
        self.namespaces = list(namespaces or [namespace])
        self.label_selector = label_selector
        self.worker_port = worker_port
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.trust = trust
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        # Replaced whole (copy on write) under the lock; readers use the reference they got.
        self._candidates: dict[tuple[str, str], tuple[_Pod, PodClaim]] = {}  # every ready labelled pod
        self._replica_sets: dict[tuple[str, str], ownership.ReplicaSetEntry] = {}  # worker-labelled ones
        self._deployments: dict[tuple[str, str], str] = {}  # the operator's Deployments -> uid
        self._refused: dict[tuple[str, str], str] = {}  # labelled pods not counted -> why (logged once)
        self._pods: dict[tuple[str, str], _Pod] = {}  # (namespace, pod name) -> where and what: the workers
        self._models: dict[tuple[str, str], _Model] = {}  # (namespace, model name) -> spec
        self._by_url: dict[str, _Pod] = {}  # the same pods by URL
        self._by_name: dict[str, dict[str, _Model]] = {}  # model name -> namespace -> its ServedModel
        self._changed_specs: set[str] = set()  # model names whose ServedModels changed (under the lock)
        self._quota_terms: dict[tuple[str, str], ServingTerms] = {}  # (namespace, ModelQuota) -> its serving terms
        self._terms: dict[str, ServingTerms] = {}  # namespace -> its strictest terms (replaced whole)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}  # the current watch of each thread

    @property
    def all_namespaces(self) -> bool:
        return ALL_NAMESPACES in self.namespaces

    # --- interface ---------------------------------------------------------------------
    def urls(self) -> list[str]:
        return sorted(self._by_url)

    def _pod(self, url: str) -> _Pod | None:
        return self._by_url.get(url)

    def node_of(self, url: str) -> str:
        pod = self._pod(url)
        return pod.node if pod else ""

    def pool_of(self, url: str) -> str:
        """The pod's pool from its labels: "shared", ``labels.dedicated_pool(model)``, or ""."""
        pod = self._pod(url)
        return pod.pool if pod else ""

    def draining(self, url: str) -> bool:
        pod = self._pod(url)
        return pod.draining if pod else False

    def identity_of(self, url: str) -> PodIdentity | None:
        """The pod at `url` (namespace, name, uid), which must prove it is that pod (status_sync.py)."""
        pod = self._pod(url)
        return pod.identity if pod else None

    def _model(self, name: str) -> _Model | None:
        found = self._by_name.get(name, {}).values()
        return min(found, key=lambda m: (not m.accepted, m.created, m.namespace), default=None)

    def spec_of(self, model: str) -> ModelSpec | None:
        found = self._model(model)
        return found.spec if found else None

    def namespace_of(self, model: str) -> str | None:
        """The namespace of the ServedModel that declares `model`."""
        found = self._model(model)
        return found.namespace if found else None

    def specs(self) -> list[ModelSpec]:
        return [spec for name in sorted(self._by_name) if (spec := self.spec_of(name)) is not None]

    def rate_of(self, namespace: str) -> RequestRate | None:
        """The request rate `namespace`'s ModelQuotas allow (the strictest); None: no limit."""
        terms = self._terms.get(namespace)
        return terms.rate if terms is not None else None

    def weight_of(self, namespace: str) -> float:
        """`namespace`'s serving weight (its ModelQuotas' ``servingWeight``, the smallest); 1 without one."""
        terms = self._terms.get(namespace)
        return terms.weight if terms is not None else DEFAULT_SERVING_WEIGHT

    def take_changed_specs(self) -> set[str]:
        with self._lock:
            changed, self._changed_specs = self._changed_specs, set()
        return changed

    def unowned_pods(self) -> int:
        """Ready pods with the worker labels that no Deployment of the operator owns: sent nothing."""
        return len(self._refused)

    def _why_not_trusted(self, key: tuple[str, str], claim: PodClaim) -> str:
        if self.trust == WorkerTrust.LABELLED:
            return ""
        return ownership.why_not_owned(key[0], claim, self._replica_sets, self._deployments)

    def _set_candidates(self, candidates: dict[tuple[str, str], tuple[_Pod, PodClaim]]) -> None:
        """Swap in the labelled pods and, from them and the owners known, the worker table and its
        index (under the lock; readers keep the one they got). Called on a pod's change and on a
        ReplicaSet's or Deployment's: pods seen before their owners are counted once those arrive."""
        pods: dict[tuple[str, str], _Pod] = {}
        refused: dict[tuple[str, str], str] = {}
        for key, (pod, claim) in candidates.items():
            why = self._why_not_trusted(key, claim)
            if why:
                refused[key] = why
            else:
                pods[key] = pod
        for key in refused.keys() - self._refused.keys():
            log.warning("pod %s/%s has the worker labels but is sent nothing: %s", *key, refused[key])
        self._candidates, self._refused = candidates, refused
        self._pods = pods
        self._by_url = {pod.url: pod for pod in pods.values()}

    def _set_models(self, models: dict[tuple[str, str], _Model], key: tuple[str, str] | None = None) -> None:
        """Swap in a new model table (under the lock) and its index by name: for one changed `key`,
        that name's entry; for a whole listing (no key), all of it. Changed names are noted."""
        if key is None:
            by_name: dict[str, dict[str, _Model]] = {}
            for (namespace, name), model in models.items():
                by_name.setdefault(name, {})[namespace] = model
            self._changed_specs.update(name for name in {*self._by_name, *by_name}
                                       if self._by_name.get(name) != by_name.get(name))
        else:
            namespace, name = key
            entries = {ns: m for ns, m in self._by_name.get(name, {}).items() if ns != namespace}
            if key in models:
                entries[namespace] = models[key]
            by_name = dict(self._by_name)
            if entries:
                by_name[name] = entries
            else:
                by_name.pop(name, None)
            self._changed_specs.add(name)
        self._models = models
        self._by_name = by_name

    def mark_wanted(self, model: str, value: str) -> None:
        """Annotate the model's ServedModel (labels.WANTED_AT): the operator starts a pod for it."""
        namespace = self.namespace_of(model)
        if namespace is None:
            return
        self._custom.patch_namespaced_custom_object(
            spec_module.GROUP, spec_module.VERSION, namespace, spec_module.PLURAL, model,
            {"metadata": {"annotations": {labels.WANTED_AT: value}}})

    def _timeouts(self) -> dict[str, Any]:
        """A list's client-side timeout; a watch adds its server-side one (see the module docstring)."""
        return {"_request_timeout": (self.request_timeout_s, self.request_timeout_s)}

    def _watch_timeouts(self) -> dict[str, Any]:
        return {"timeout_seconds": int(self.watch_timeout_s),
                "_request_timeout": (self.request_timeout_s, self.watch_timeout_s + self.request_timeout_s)}

    # --- watches ---------------------------------------------------------------------------
    def start(self) -> None:
        scopes: list[str | None] = [None] if self.all_namespaces else list(self.namespaces)
        targets = [self._watch_pods, self._watch_served_models, self._watch_quotas]
        if self.trust == WorkerTrust.OWNED:
            targets += [self._watch_replica_sets, self._watch_deployments]
        for scope in scopes:
            for target in targets:
                thread = threading.Thread(target=self._forever, args=(target, scope), daemon=True,
                                          name=f"{target.__name__}-{scope or 'all'}")
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()

    def _forever(self, target: Callable[[str | None], None], scope: str | None) -> None:
        while not self._stop.is_set():
            try:
                target(scope)
            except Exception as exc:  # a watch that ends or fails is restarted (410 Gone included)
                log.warning("watch %s ended: %s; restarting", target.__name__, exc)
                self._stop.wait(1.0)

    def _pod_entry(self, pod: Any) -> _Pod | None:
        url = pod_url(pod, self.worker_port)
        if url is None:
            return None
        meta = pod.metadata
        return _Pod(url, pod.spec.node_name or "", labels.pool_of(meta.labels or {}),
                    bool((meta.annotations or {}).get(labels.DRAINING)),
                    PodIdentity(meta.namespace or self.namespace, meta.name or "", meta.uid or ""))

    def apply_pod_event(self, kind: str, pod: Any) -> None:
        key = (pod.metadata.namespace or self.namespace, pod.metadata.name)
        entry = self._pod_entry(pod) if kind != "DELETED" else None
        with self._lock:
            candidates = dict(self._candidates)
            if entry is None:
                candidates.pop(key, None)
            else:
                candidates[key] = (entry, pod_claim(pod))
            self._set_candidates(candidates)

    def _owner_body(self, obj: Any) -> dict[str, Any]:
        """A kubernetes-client object as the API's own JSON (camelCase), which ownership reads."""
        return self._core.api_client.sanitize_for_serialization(obj)

    def apply_replica_set_event(self, kind: str, replica_set: Any) -> None:
        body = self._owner_body(replica_set)
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or self.namespace, meta.get("name", ""))
        with self._lock:
            found = dict(self._replica_sets)
            if kind == "DELETED":
                found.pop(key, None)
            else:
                found[key] = ownership.replica_set_entry(body)
            self._replica_sets = found
            self._set_candidates(self._candidates)

    def apply_deployment_event(self, kind: str, deployment: Any) -> None:
        meta = deployment.metadata
        key = (meta.namespace or self.namespace, meta.name)
        with self._lock:
            found = dict(self._deployments)
            if kind == "DELETED":
                found.pop(key, None)
            else:
                found[key] = meta.uid or ""
            self._deployments = found
            self._set_candidates(self._candidates)

    def _model_entry(self, body: dict[str, Any]) -> _Model | None:
        meta = body.get("metadata", {})
        namespace = meta.get("namespace") or self.namespace
        try:
            return _Model(ModelSpec.from_served_model(body), namespace, _accepted(body),
                          str(meta.get("creationTimestamp", "")))
        except ValueError as exc:
            log.warning("ServedModel %s/%s ignored: %s", namespace, meta.get("name", ""), exc)
            return None

    def apply_served_model_event(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = (meta.get("namespace") or self.namespace, meta.get("name", ""))
        entry = self._model_entry(body) if kind != "DELETED" else None
        with self._lock:
            models = dict(self._models)
            if entry is None:
                models.pop(key, None)
            else:
                models[key] = entry
            self._set_models(models, key)

    def _pod_lister(self, scope: str | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The kubernetes client call (and its leading arguments) that lists worker pods in `scope`
        (None: every namespace); watch.Watch streams the same call."""
        if scope is None:
            return self._core.list_pod_for_all_namespaces, ()
        return self._core.list_namespaced_pod, (scope,)

    def _model_lister(self, scope: str | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        what = (spec_module.GROUP, spec_module.VERSION)
        if scope is None:
            return self._custom.list_cluster_custom_object, (*what, spec_module.PLURAL)
        return self._custom.list_namespaced_custom_object, (*what, scope, spec_module.PLURAL)

    def _watch_pods(self, scope: str | None) -> None:
        from kubernetes import watch

        lister, args = self._pod_lister(scope)
        listing = lister(*args, label_selector=self.label_selector, **self._timeouts())
        fresh = {(pod.metadata.namespace or self.namespace, pod.metadata.name): (entry, pod_claim(pod))
                 for pod in listing.items if (entry := self._pod_entry(pod)) is not None}
        with self._lock:  # swapped whole: never empty while the watch restarts
            self._set_candidates({k: v for k, v in self._candidates.items() if scope is not None and k[0] != scope}
                                 | fresh)
        w = self._watches[f"pods-{scope or 'all'}"] = watch.Watch()
        for event in w.stream(lister, *args, label_selector=self.label_selector,
                              resource_version=listing.metadata.resource_version, **self._watch_timeouts()):
            self.apply_pod_event(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()

    def _follow(self, name: str, scope: str | None, lister: Callable[..., Any], args: tuple[Any, ...],
                selector: str, replace: Callable[[list[Any]], None], apply: Callable[[str, Any], None]) -> None:
        """List, hand the whole listing to `replace` (under the lock), then watch from its version."""
        from kubernetes import watch

        listing = lister(*args, label_selector=selector, **self._timeouts())
        with self._lock:
            replace(listing.items)
        w = self._watches[f"{name}-{scope or 'all'}"] = watch.Watch()
        for event in w.stream(lister, *args, label_selector=selector,
                              resource_version=listing.metadata.resource_version, **self._watch_timeouts()):
            apply(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()

    def _kept(self, table: dict[tuple[str, str], Any], scope: str | None) -> dict[tuple[str, str], Any]:
        """What a fresh listing of `scope` does not replace: the other namespaces' entries."""
        return {k: v for k, v in table.items() if scope is not None and k[0] != scope}

    def _watch_replica_sets(self, scope: str | None) -> None:
        """The worker-labelled ReplicaSets (a Deployment's ReplicaSets carry its pod template's labels)."""
        lister, args = ((self._apps.list_replica_set_for_all_namespaces, ()) if scope is None else
                        (self._apps.list_namespaced_replica_set, (scope,)))

        def replace(items: list[Any]) -> None:
            fresh = {}
            for item in items:
                body = self._owner_body(item)
                fresh[(item.metadata.namespace or self.namespace, item.metadata.name)] = \
                    ownership.replica_set_entry(body)
            self._replica_sets = self._kept(self._replica_sets, scope) | fresh
            self._set_candidates(self._candidates)

        self._follow("replicasets", scope, lister, args, self.label_selector, replace, self.apply_replica_set_event)

    def _watch_deployments(self, scope: str | None) -> None:
        """The Deployments the operator manages (labelled managed-by), by uid."""
        lister, args = ((self._apps.list_deployment_for_all_namespaces, ()) if scope is None else
                        (self._apps.list_namespaced_deployment, (scope,)))

        def replace(items: list[Any]) -> None:
            fresh = {(item.metadata.namespace or self.namespace, item.metadata.name): item.metadata.uid or ""
                     for item in items}
            self._deployments = self._kept(self._deployments, scope) | fresh
            self._set_candidates(self._candidates)

        self._follow("deployments", scope, lister, args, ownership.OPERATOR_DEPLOYMENTS, replace,
                     self.apply_deployment_event)

    def _watch_served_models(self, scope: str | None) -> None:
        from kubernetes import watch

        lister, args = self._model_lister(scope)
        listing = lister(*args, **self._timeouts())
        fresh = {(entry.namespace, item["metadata"]["name"]): entry for item in listing.get("items", [])
                 if (entry := self._model_entry(item)) is not None}
        with self._lock:
            models = {k: v for k, v in self._models.items() if scope is not None and k[0] != scope} | fresh
            self._set_models(models)
        w = self._watches[f"servedmodels-{scope or 'all'}"] = watch.Watch()
        for event in w.stream(lister, *args, resource_version=listing.get("metadata", {}).get("resourceVersion"),
                              **self._watch_timeouts()):
            self.apply_served_model_event(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()

    # --- ModelQuotas: each namespace's request rate (rates.py) and serving weight (shares) --------
    def apply_quota_event(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = (meta.get("namespace") or self.namespace, meta.get("name", ""))
        terms = ServingTerms.of_quota(body.get("spec") or {}) if kind != "DELETED" else ServingTerms()
        with self._lock:
            quotas = dict(self._quota_terms)
            if not terms:
                quotas.pop(key, None)
            else:
                quotas[key] = terms
            self._set_quota_terms(quotas)

    def _set_quota_terms(self, quotas: dict[tuple[str, str], ServingTerms]) -> None:
        by_namespace: dict[str, list[ServingTerms]] = {}
        for (namespace, _), terms in quotas.items():
            by_namespace.setdefault(namespace, []).append(terms)
        self._quota_terms = quotas
        self._terms = {ns: ServingTerms.strictest(each) for ns, each in by_namespace.items()}

    def _watch_quotas(self, scope: str | None) -> None:
        from kubernetes import client, watch

        what = (spec_module.GROUP, spec_module.VERSION)
        lister, args = ((self._custom.list_cluster_custom_object, (*what, QUOTA_PLURAL)) if scope is None else
                        (self._custom.list_namespaced_custom_object, (*what, scope, QUOTA_PLURAL)))
        try:
            listing = lister(*args, **self._timeouts())
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            log.info("no ModelQuota CRD (%s): no request-rate limits; looking again in %d s", scope or "all",
                     QUOTA_CRD_RETRY_S)
            self._stop.wait(QUOTA_CRD_RETRY_S)
            return
        fresh = {(item["metadata"].get("namespace") or self.namespace, item["metadata"]["name"]): terms
                 for item in listing.get("items", []) if (terms := ServingTerms.of_quota(item.get("spec") or {}))}
        with self._lock:
            self._set_quota_terms({k: v for k, v in self._quota_terms.items() if scope is not None and k[0] != scope}
                                  | fresh)
        w = self._watches[f"modelquotas-{scope or 'all'}"] = watch.Watch()
        for event in w.stream(lister, *args, resource_version=listing.get("metadata", {}).get("resourceVersion"),
                              **self._watch_timeouts()):
            self.apply_quota_event(event["type"], event["object"])
            if self._stop.is_set():
                w.stop()
