"""The model-to-pod map: which pod holds which model, in which state, with how much room.

Workers are the source of truth: every pod's entry follows its own
``GET /status`` reports, whole on first contact, then what changed since
the last one (status_sync.py, status_report.py on the worker). The router adds
only what it knows sooner than the next report: loads it has started itself
(so two placements do not count the same free bytes twice), copies it saw
fail (so no request goes there until the worker says otherwise) and its own
in-flight counts (for power of two choices). A pod that stops answering is
removed at once.

Indexed by model: a request's routing work depends only on its model's
copies (``ready_copies`` reads one small dict, never a pod's copies), and a
report costs what it changed. Each pod keeps what its worker reported
(``PodView.reported``) apart from what the map shows (``PodView.copies``:
the report with the router's own newer knowledge laid over it), and the
map keeps the shown copies a second time by model (``copies_of``), the pods
whose catalog lists each model, and per pod its reservations, suspects and
recent loads and unloads, so nothing walks every pod or every model.

A FAILED copy in a report is a worker's record of its last failed load: it
holds no bytes and is neither ready nor loading, so it never attracts a
request, and it does not stand for a load the router started since.

Reports are stamped with when they were asked for (``asked_at``, the map's
clock). What the router learned itself after that moment (a load it saw
finish, an unload it made, a copy it saw fail) is newer than the report and
survives it; what it learned before, the report replaces. So a report that
left a worker before a load finished can land after it without erasing the
new copy, and nothing on the request path has to poll for a fresher one.

Demand: each reported copy carries the worker's decayed request count; the
rise from one report of a copy to the next, less its decay, is how many
requests the worker served meanwhile, from every router. Those arrivals go
to ``on_arrivals`` (the replication policy), so every router replica counts
the same demand (replication.py).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

from hotset_common.eviction import DEFAULT_HALF_LIFE_S, Candidate
from hotset_common.spec import LatencyClass
from hotset_common.wire import CatalogEntry, CopyState, EngineLoad, ModelCopy, WorkerStatus

HELD_STATES = (CopyState.READY, CopyState.LOADING, CopyState.UNLOADING)


@dataclasses.dataclass(frozen=True)
class ModelTerms:
    """How a model asks to be served, beyond its bytes, as the workers' catalogs say: one record
    per model, kept only for models whose terms are not the defaults."""

    latency_class: LatencyClass = LatencyClass.STANDARD  # which models it may not share a pod with
    load_timeout_s: float | None = None  # its loadTimeoutSeconds; None: the router's
    priority: int = 0  # its spec.priority: its load evicts no copy above it

    @classmethod
    def of(cls, entry: CatalogEntry) -> "ModelTerms":
        return cls(entry.latency_class, entry.load_timeout_s if entry.load_timeout_s > 0 else None, entry.priority)


DEFAULT_TERMS = ModelTerms()


@dataclasses.dataclass
class CopyView:
    """One model's copy on one pod, as the router sees it. Times and the request count are as of
    `seen_at` (the map's clock) and aged to any later moment by the accessors."""

    model: str
    state: CopyState
    bytes: int = 0
    pinned: bool = False
    last_used_s: float = 0.0
    loaded_at_s: float = 0.0
    load_seconds: float = 0.0
    frequency: float = 0.0
    inflight: int = 0
    queued: int = 0
    seen_at: float = 0.0
    half_life_s: float = DEFAULT_HALF_LIFE_S
    priority: int = 0  # its model's spec.priority (a lower-priority load may not evict it)

    @classmethod
    def of(cls, copy: ModelCopy, seen_at: float = 0.0, half_life_s: float = DEFAULT_HALF_LIFE_S) -> "CopyView":
        return cls(copy.id, copy.state, copy.bytes, copy.pinned, copy.last_used_s, copy.loaded_at_s,
                   copy.load_seconds, copy.frequency, copy.inflight, copy.queued, seen_at, half_life_s, copy.priority)

    def _since(self, now: float | None) -> float:
        return 0.0 if now is None else max(0.0, now - self.seen_at)

    def idle_s(self, now: float | None = None) -> float:
        return self.last_used_s + self._since(now)

    def frequency_at(self, now: float | None = None) -> float:
        return self.frequency * 0.5 ** (self._since(now) / self.half_life_s) if self.frequency else 0.0

    def candidate(self, now: float | None = None) -> Candidate:
        """This copy as the shared eviction policy sees it (the worker decides from the same figures)."""
        since = self._since(now)
        return Candidate(self.model, self.bytes, self.last_used_s + since, self.loaded_at_s + since, self.load_seconds,
                         self.frequency_at(now), self.inflight, self.queued, self.priority)


@dataclasses.dataclass
class PodView:
    """One worker pod: where to reach it, its room, and its copies."""

    url: str
    name: str
    node: str = ""
    ready: bool = True
    budget_bytes: int = 0
    free_bytes: int = 0
    max_models: int | None = None
    churn_guard_s: float = 0.0
    queued: int = 0  # requests waiting in its admission queue
    copies: dict[str, CopyView] = dataclasses.field(default_factory=dict)  # what the map shows
    catalog: dict[str, int] = dataclasses.field(default_factory=dict)  # model id -> estimated bytes
    draining: bool = False  # the operator is emptying it before the pool shrinks: no new copies go there
    canaries: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)  # model -> (its canary's id, weight %)
    reported: dict[str, CopyView] = dataclasses.field(default_factory=dict)  # what its worker reported
    routers: tuple[str, ...] = ()  # router replicas its worker heard from lately
    held: int = 0  # shown copies that occupy memory (not failed loads)
    grpc_port: int | None = None  # where its worker serves OIP v2 over gRPC (at its URL's host); None: nowhere
    # Its vLLM engines' own figures (queue, running, KV cache), by the model whose engine it is, as
    # its last report said (the prefix-aware choice among copies scores them: prefix_routing.py).
    engines: dict[str, EngineLoad] = dataclasses.field(default_factory=dict)

    def ready_models(self) -> set[str]:
        return {m for m, c in self.copies.items() if c.state == CopyState.READY}

    def holds(self, model: str) -> bool:
        """Whether the pod shows a copy of `model` that occupies memory (not a failed load)."""
        copy = self.copies.get(model)
        return copy is not None and copy.state != CopyState.FAILED


def _occupies(copy: CopyView | None) -> int:
    return copy.bytes if copy is not None and copy.state != CopyState.FAILED else 0


class ModelMap:
    """Pods keyed by URL and copies keyed by model, refreshed from worker reports; the router's only
    view of the cluster."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 on_arrivals: Callable[[str, float], None] | None = None) -> None:
        self.clock = clock
        self.on_arrivals = on_arrivals
        self._pods: dict[str, PodView] = {}
        self._by_model: dict[str, dict[str, CopyView]] = {}  # model -> url -> the copy shown
        # model -> urls whose catalog lists it (a dict of str -> None, not a set: such a dict holds
        # nothing the garbage collector must look into, so it is untracked, and 10,000 models x 50
        # pods cost a full collection nothing; sets of 50 urls each cost it 6 ms, the event loop held)
        self._catalog_pods: dict[str, dict[str, None]] = {}
        self._canaries: dict[str, dict[str, tuple[str, int]]] = {}  # model -> url -> its canary (rare)
        self._terms: dict[str, ModelTerms] = {}  # models whose terms are not the defaults
        self._classes: dict[LatencyClass, set[str]] = {}  # realtime and batch models, from _terms (an index)
        self._multi: set[str] = set()  # models shown on two pods or more (extra copies may go)
        self._busy: set[str] = set()  # models whose workers report requests in flight or waiting on them
        # What the router learned itself, per pod: url -> model -> ...
        self._reserved: dict[str, dict[str, int]] = {}  # bytes of a load the router started
        self._reserving: dict[str, set[str]] = {}  # model -> urls with such a load
        self._suspect: dict[str, dict[str, float]] = {}  # copies that just failed a request -> when
        self._loaded: dict[str, dict[str, tuple[float, CopyView]]] = {}  # copies the router saw loaded -> when
        self._unloaded: dict[str, dict[str, float]] = {}  # copies the router unloaded -> when
        self._started: dict[str, dict[str, float]] = {}  # loads the router started -> when (their load seconds)
        self._inflight: dict[str, dict[str, int]] = {}  # model -> url -> requests in flight
        self._pod_inflight: dict[str, int] = {}
        # url -> (copies, entries) of a whole report so far (dicts of str -> None: untracked, as above)
        self._resets: dict[str, tuple[dict[str, None], dict[str, None]]] = {}
        self._changed: set[str] = set()  # models whose copies changed (the copy loop looks at them)
        self._routers: frozenset[str] | None = frozenset()

    # --- updates -----------------------------------------------------------------

    def now(self) -> float:
        """The map's clock: stamp a status request with it before sending it."""
        return self.clock()

    def apply_status(self, url: str, status: WorkerStatus, node: str = "", asked_at: float | None = None,
                     draining: bool = False) -> None:
        """Follow the worker's own report, asked for at `asked_at` (default: now), keeping what the
        router learned itself after that moment. A whole report (``delta`` false) replaces what the
        map knew of the pod once its last page (``more`` false) is in; a delta changes what it names."""
        asked_at = self.clock() if asked_at is None else asked_at
        pod = self._pods.get(url)
        if pod is None:
            pod = self._pods[url] = PodView(url=url, name=status.pod or url)
        was = (pod.ready, pod.draining)
        self._pod_figures(pod, status, node, draining)
        if not status.delta:
            self._resets[url] = ({}, {})
        seen = self._resets.get(url)
        touched = self._take_copies(pod, status, asked_at, seen)
        self._take_catalog(pod, status, seen)
        if seen is not None and not status.more:  # the whole state is in: what it did not name is gone
            del self._resets[url]
            for model in [m for m in pod.reported if m not in seen[0]]:
                del pod.reported[model]
                touched.add(model)
            for model in [m for m in pod.catalog if m not in seen[1]]:
                self._drop_entry(pod, model)
        touched |= self._expire_knowledge(url, asked_at)
        for model in touched:
            self._show(pod, model)
        pod.free_bytes = status.free_bytes + self._overlay_bytes(pod)
        for model in [m for m in self._reserved.get(url, {}) if pod.holds(m)]:
            self.release_load(url, model)
        if was != (pod.ready, pod.draining):
            self._changed.update(pod.copies)

    def _pod_figures(self, pod: PodView, status: WorkerStatus, node: str, draining: bool) -> None:
        pod.name = status.pod or pod.url
        pod.node = node or pod.node
        pod.ready = status.ready
        pod.budget_bytes = status.memory_budget_bytes
        pod.max_models = status.max_models
        pod.churn_guard_s = status.churn_guard_s
        pod.queued = status.queued_requests
        pod.grpc_port = status.grpc_port
        pod.engines = {load.model: load for load in status.engines}
        pod.draining = draining
        routers = tuple(status.routers)
        if routers != pod.routers:
            pod.routers = routers
            self._routers = None

    def _take_copies(self, pod: PodView, status: WorkerStatus, asked_at: float,
                     seen: tuple[dict[str, None], dict[str, None]] | None) -> set[str]:
        touched: set[str] = set()
        half_life = status.demand_half_life_s or DEFAULT_HALF_LIFE_S
        for copy in status.models:
            view = CopyView.of(copy, asked_at, half_life)
            self._count_arrivals(pod.reported.get(copy.id), view)
            pod.reported[copy.id] = view
            touched.add(copy.id)
            if seen is not None:
                seen[0][copy.id] = None
        for model in status.removed_models:
            if pod.reported.pop(model, None) is not None:
                touched.add(model)
        return touched

    def _count_arrivals(self, before: CopyView | None, after: CopyView) -> None:
        """Requests the worker served between two reports of one copy: the rise of its decayed count."""
        if self.on_arrivals is None or before is None or after.frequency <= 0:
            return
        arrived = after.frequency - before.frequency_at(after.seen_at)
        if arrived > 0.5:  # less is the two reports' timing, not a request
            self.on_arrivals(after.model, arrived)

    def _take_catalog(self, pod: PodView, status: WorkerStatus,
                      seen: tuple[dict[str, None], dict[str, None]] | None) -> None:
        for entry in status.catalog:
            self._put_entry(pod, entry)
            if seen is not None:
                seen[1][entry.id] = None
        for model in status.removed_catalog:
            self._drop_entry(pod, model)

    def _put_entry(self, pod: PodView, entry: CatalogEntry) -> None:
        if entry.id not in pod.catalog:
            self._catalog_pods.setdefault(entry.id, {})[pod.url] = None
            self._changed.add(entry.id)
        pod.catalog[entry.id] = entry.memory_bytes
        self._set_terms(entry.id, ModelTerms.of(entry))
        if entry.canary:
            pod.canaries[entry.id] = (entry.canary, entry.canary_weight)
            self._canaries.setdefault(entry.id, {})[pod.url] = (entry.canary, entry.canary_weight)
        elif pod.canaries.pop(entry.id, None) is not None:
            self._drop_canary(pod.url, entry.id)

    def _drop_entry(self, pod: PodView, model: str) -> None:
        if pod.catalog.pop(model, None) is None:
            return
        urls = self._catalog_pods.get(model)
        if urls is not None:
            urls.pop(pod.url, None)
            if not urls:
                del self._catalog_pods[model]
                self._set_terms(model, DEFAULT_TERMS)
        if pod.canaries.pop(model, None) is not None:
            self._drop_canary(pod.url, model)
        self._changed.add(model)

    def _set_terms(self, model: str, terms: ModelTerms) -> None:
        before = self._terms.get(model, DEFAULT_TERMS)
        if terms == before:
            return
        if before.latency_class is not LatencyClass.STANDARD:
            self._classes[before.latency_class].discard(model)
        if terms.latency_class is not LatencyClass.STANDARD:
            self._classes.setdefault(terms.latency_class, set()).add(model)
        if terms == DEFAULT_TERMS:
            del self._terms[model]
        else:
            self._terms[model] = terms

    def terms(self, model: str) -> ModelTerms:
        """How `model` asks to be served, as the workers' catalogs say (the defaults when unknown)."""
        return self._terms.get(model, DEFAULT_TERMS)

    def latency_class(self, model: str) -> LatencyClass:
        return self.terms(model).latency_class

    def load_timeout_s(self, model: str) -> float | None:
        return self.terms(model).load_timeout_s

    def priority(self, model: str) -> int:
        return self.terms(model).priority

    def pods_excluded_for(self, model: str) -> set[str]:
        """Pods holding (or loading, or about to load for this router) a copy of the latency class
        `model`'s may not share a pod with. Reads only the copies of that class's models."""
        excluded = self.latency_class(model).excludes()
        urls: set[str] = set()
        for other in self._classes.get(excluded, ()) if excluded is not None else ():
            urls.update(url for url, copy in self._by_model.get(other, {}).items()
                        if copy.state in (CopyState.READY, CopyState.LOADING))
            urls.update(self._reserving.get(other, ()))
        return urls

    def _drop_canary(self, url: str, model: str) -> None:
        by_pod = self._canaries.get(model, {})
        by_pod.pop(url, None)
        if not by_pod:
            self._canaries.pop(model, None)

    def _expire_knowledge(self, url: str, asked_at: float) -> set[str]:
        """Forget what the report (asked at `asked_at`) supersedes; the models whose view may change:
        those, and those whose newer knowledge is laid over the report again."""
        suspect = self._suspect.get(url, {})
        for model in [m for m, at in suspect.items() if at <= asked_at]:
            del suspect[model]
        unloaded = self._unloaded.get(url, {})
        loaded = self._loaded.get(url, {})
        touched = set(unloaded) | set(loaded)
        for model in [m for m, at in unloaded.items() if at <= asked_at]:
            del unloaded[model]
        for model in [m for m, (at, _) in loaded.items() if at <= asked_at]:
            del loaded[model]
        return touched

    def _show(self, pod: PodView, model: str) -> None:
        """Set what the map shows of `model` on `pod`: the report, with the router's newer knowledge over it."""
        shown = pod.reported.get(model)
        if model in self._unloaded.get(pod.url, ()):
            shown = None
        loaded = self._loaded.get(pod.url, {}).get(model)
        if loaded is not None and (shown is None or shown.state != CopyState.READY):
            shown = loaded[1]
        self._set_copy(pod, model, shown)

    def _overlay_bytes(self, pod: PodView) -> int:
        """Free bytes the router's newer knowledge adds to the report's (loads seen finish take room,
        unloads give it back)."""
        extra = 0
        for model in set(self._loaded.get(pod.url, ())) | set(self._unloaded.get(pod.url, ())):
            extra += _occupies(pod.reported.get(model)) - _occupies(pod.copies.get(model))
        return extra

    def _set_copy(self, pod: PodView, model: str, copy: CopyView | None) -> None:
        previous = pod.copies.get(model)
        if copy is previous:
            return
        if copy is None:
            del pod.copies[model]
            holders = self._by_model[model]
            del holders[pod.url]
            if not holders:
                del self._by_model[model]
        else:
            pod.copies[model] = copy
            holders = self._by_model.setdefault(model, {})
            holders[pod.url] = copy
        pod.held += (copy is not None and copy.state != CopyState.FAILED) - (
            previous is not None and previous.state != CopyState.FAILED)
        holders = self._by_model.get(model, {})
        if len(holders) >= 2:
            self._multi.add(model)
        else:
            self._multi.discard(model)
        if any(c.inflight or c.queued for c in holders.values()):
            self._busy.add(model)
        else:
            self._busy.discard(model)
        if previous is None or copy is None or previous.state != copy.state:
            self._changed.add(model)

    def remove_pod(self, url: str) -> None:
        """Forget a pod at once (it stopped answering or left the cluster)."""
        pod = self._pods.pop(url, None)
        if pod is not None:
            for model in list(pod.copies):
                self._set_copy(pod, model, None)
            for model in list(pod.catalog):
                self._drop_entry(pod, model)
            if pod.routers:
                self._routers = None
        for table in (self._suspect, self._loaded, self._unloaded, self._started):
            table.pop(url, None)
        for model in list(self._reserved.get(url, ())):
            self.release_load(url, model)
        self._resets.pop(url, None)

    def mark_copy_failed(self, url: str, model: str) -> None:
        """No more requests for `model` to `url` until a report asked for after now."""
        self._suspect.setdefault(url, {})[model] = self.clock()
        self._loaded.get(url, {}).pop(model, None)

    def reserve_load(self, url: str, model: str, nbytes: int) -> None:
        """Count a load the router started, before the worker reports it."""
        self._reserved.setdefault(url, {})[model] = nbytes
        self._reserving.setdefault(model, set()).add(url)
        self._started.setdefault(url, {})[model] = self.clock()
        self._changed.add(model)

    def release_load(self, url: str, model: str) -> None:
        reserved = self._reserved.get(url)
        if reserved is None or reserved.pop(model, None) is None:
            return
        if not reserved:
            del self._reserved[url]
        urls = self._reserving.get(model)
        if urls is not None:
            urls.discard(url)
            if not urls:
                del self._reserving[model]
        self._changed.add(model)

    def record_loaded(self, url: str, model: str, nbytes: int) -> None:
        """The worker answered our load: the copy is ready. Until its next report gives the measured
        figures, it is what the worker would report now: just loaded, wanted once."""
        pod = self._pods.get(url)
        self.release_load(url, model)
        self._suspect.get(url, {}).pop(model, None)
        self._unloaded.get(url, {}).pop(model, None)
        started = self._started.get(url, {}).pop(model, None)
        if pod is not None and (model not in pod.copies or pod.copies[model].state != CopyState.READY):
            previous = pod.copies.get(model)
            # What eviction plans need of it (a copy seen loading for 0 s would look free to evict).
            seconds = max(self.clock() - started if started is not None else 0.0,
                          previous.load_seconds if previous is not None else 0.0)
            copy = CopyView(model, CopyState.READY, nbytes, frequency=1.0, load_seconds=seconds, seen_at=self.clock())
            self._loaded.setdefault(url, {})[model] = (self.clock(), copy)
            self._set_copy(pod, model, copy)
            pod.free_bytes -= nbytes - _occupies(previous)

    def record_unloaded(self, url: str, model: str) -> None:
        """The router unloaded this copy: a report asked for before now no longer shows it."""
        pod = self._pods.get(url)
        self._loaded.get(url, {}).pop(model, None)
        if pod is not None:
            self._unloaded.setdefault(url, {})[model] = self.clock()
            if model in pod.copies:
                pod.free_bytes += pod.copies[model].bytes
                self._set_copy(pod, model, None)

    # --- in-flight counts (power of two choices) ------------------------------------------

    def begin_request(self, url: str, model: str) -> None:
        by_pod = self._inflight.setdefault(model, {})
        by_pod[url] = by_pod.get(url, 0) + 1
        self._pod_inflight[url] = self._pod_inflight.get(url, 0) + 1

    def end_request(self, url: str, model: str) -> None:
        by_pod = self._inflight.get(model, {})
        left = by_pod.get(url, 1) - 1
        if left <= 0:
            by_pod.pop(url, None)
            if not by_pod:
                self._inflight.pop(model, None)
        else:
            by_pod[url] = left
        pod_left = self._pod_inflight.get(url, 1) - 1
        if pod_left <= 0:
            self._pod_inflight.pop(url, None)
        else:
            self._pod_inflight[url] = pod_left

    def inflight(self, url: str, model: str | None = None) -> int:
        if model is not None:
            return self._inflight.get(model, {}).get(url, 0)
        return self._pod_inflight.get(url, 0)

    def model_inflight(self, model: str) -> int:
        """This router's requests in flight for `model`."""
        return sum(self._inflight.get(model, {}).values())

    def reported_load(self, model: str) -> int:
        """In-flight and waiting requests on `model`'s copies as their workers report them: every
        router's requests, not only this one's."""
        return sum(c.inflight + c.queued for c in self._by_model.get(model, {}).values())

    def busy_models(self) -> set[str]:
        """Models with requests in flight: this router's, or any, as the workers last reported."""
        return self._busy | set(self._inflight)

    # --- what changed (the copy loop) --------------------------------------------------------

    def take_changed(self) -> set[str]:
        """Models whose copies, catalog entries or reservations changed since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def multi_copy_models(self) -> set[str]:
        """Models shown on two pods or more."""
        return set(self._multi)

    def models_on_draining_pods(self) -> set[str]:
        return {m for pod in self._pods.values() if pod.draining for m in pod.copies}

    def router_ids(self) -> frozenset[str]:
        """Router replicas some worker heard from lately (cached until a pod's list changes)."""
        if self._routers is None:
            self._routers = frozenset(r for pod in self._pods.values() for r in pod.routers)
        return self._routers

    # --- queries --------------------------------------------------------------------------

    def pods(self) -> list[PodView]:
        return list(self._pods.values())

    def pod(self, url: str) -> PodView | None:
        return self._pods.get(url)

    def ready_pods(self) -> list[PodView]:
        return [p for p in self._pods.values() if p.ready]

    def ready_copies(self, model: str) -> list[str]:
        """URLs of ready pods where `model` is ready and has not just failed; copies on draining pods
        only when there is no other (requests move off a pod before the pool lets it go)."""
        holders = self._by_model.get(model)
        if not holders:
            return []
        staying: list[str] = []
        leaving: list[str] = []
        for url, copy in holders.items():
            if copy.state != CopyState.READY or model in self._suspect.get(url, ()):
                continue
            pod = self._pods[url]
            if pod.ready:
                (leaving if pod.draining else staying).append(url)
        return staying or leaving

    def loading_copies(self, model: str) -> list[str]:
        """URLs where `model` is being loaded (reported by the worker or started by the router)."""
        urls = {u for u in self._reserving.get(model, ()) if u in self._pods}
        urls |= {u for u, c in self._by_model.get(model, {}).items() if c.state == CopyState.LOADING}
        return sorted(urls)

    def engine_load(self, url: str, model: str, base: str = "") -> EngineLoad | None:
        """What the engine that serves `model` on `url` (its own, or `base`'s for an adapter) said of
        its load in the pod's last report; None: no engine figures (another framework, not yet read)."""
        pod = self._pods.get(url)
        if pod is None:
            return None
        return pod.engines.get(base or model)

    def free_bytes(self, url: str) -> int:
        """Free bytes of a pod less what the router's own unreported loads will take."""
        pod = self._pods[url]
        reserved = sum(n for m, n in self._reserved.get(url, {}).items() if not pod.holds(m))
        return pod.free_bytes - reserved

    def free_slots(self, url: str) -> int | None:
        """Copies the pod may still add under its model count limit (None: no limit), less the
        router's own unreported loads."""
        pod = self._pods[url]
        if pod.max_models is None:
            return None
        reserved = sum(1 for m in self._reserved.get(url, {}) if not pod.holds(m))
        return pod.max_models - pod.held - reserved

    def known_models(self) -> set[str]:
        """Every model some pod can load or holds."""
        return set(self._catalog_pods) | set(self._by_model)

    def model_names(self) -> list[str]:
        """The known models as a list (some may be listed twice): cheaper than ``known_models``."""
        return [*self._catalog_pods, *self._by_model]

    def is_known(self, model: str) -> bool:
        return model in self._catalog_pods or model in self._by_model

    def estimated_bytes(self, model: str, fallback: int = 0) -> int:
        """Measured size of an existing copy if any (measured wins), else the catalog estimate."""
        measured = [c.bytes for c in self._by_model.get(model, {}).values() if c.bytes > 0]
        if measured:
            return max(measured)
        estimates = [n for url in self._catalog_pods.get(model, ()) if (n := self._pods[url].catalog.get(model))]
        return max(estimates) if estimates else fallback

    def canary_of(self, model: str) -> tuple[str, int] | None:
        """`model`'s canary version (its id) and the percent of requests it takes, as the workers'
        catalogs say (they follow the model store, so an edited rollout reaches the router with the
        next reports); None when it has none."""
        by_pod = self._canaries.get(model)
        return next(iter(by_pod.values())) if by_pod else None

    def pods_with_catalog(self, model: str) -> list[PodView]:
        """Ready pods that can load `model`."""
        return [pod for url in sorted(self._catalog_pods.get(model, ())) if (pod := self._pods[url]).ready]

    def copies_of(self, model: str) -> list[tuple[PodView, CopyView]]:
        return [(self._pods[url], copy) for url, copy in self._by_model.get(model, {}).items()]

    def urls(self) -> Iterable[str]:
        return list(self._pods)
