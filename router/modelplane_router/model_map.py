"""The model-to-pod map: which pod holds which model, in which state, with how much room.

Workers are the source of truth: every pod's entry is replaced wholesale by
its own ``GET /status`` report. The router adds only what it knows sooner than
the next report: loads it has started itself (so two placements do not count
the same free bytes twice), copies it saw fail (so no request goes there
until the worker says otherwise) and its own in-flight counts (for power of
two choices). A pod that stops answering is removed at once.

A FAILED copy in a report is a worker's record of its last failed load: it
holds no bytes and is neither ready nor loading, so it never attracts a
request, and it does not stand for a load the router started since.

Reports are stamped with when they were asked for (``asked_at``, the map's
clock). What the router learned itself after that moment (a load it saw
finish, an unload it made, a copy it saw fail) is newer than the report and
survives it; what it learned before, the report replaces. So a report that
left a worker before a load finished can land after it without erasing the
new copy, and nothing on the request path has to poll for a fresher one.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

from modelplane_common.eviction import Candidate
from modelplane_common.wire import CopyState, ModelCopy, WorkerStatus


@dataclasses.dataclass
class CopyView:
    """One model's copy on one pod, as the router sees it."""

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

    @classmethod
    def of(cls, copy: ModelCopy) -> "CopyView":
        return cls(copy.id, copy.state, copy.bytes, copy.pinned, copy.last_used_s, copy.loaded_at_s,
                   copy.load_seconds, copy.frequency, copy.inflight, copy.queued)

    def candidate(self) -> Candidate:
        """This copy as the shared eviction policy sees it (the worker decides from the same figures)."""
        return Candidate(self.model, self.bytes, self.last_used_s, self.loaded_at_s, self.load_seconds,
                         self.frequency, self.inflight, self.queued)


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
    copies: dict[str, CopyView] = dataclasses.field(default_factory=dict)
    catalog: dict[str, int] = dataclasses.field(default_factory=dict)  # model id -> estimated bytes
    draining: bool = False  # the operator is emptying it before the pool shrinks: no new copies go there
    canaries: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)  # model -> (its canary's id, weight %)

    def ready_models(self) -> set[str]:
        return {m for m, c in self.copies.items() if c.state == CopyState.READY}

    def holds(self, model: str) -> bool:
        """Whether the pod reports a copy of `model` that occupies memory (not a failed load)."""
        copy = self.copies.get(model)
        return copy is not None and copy.state != CopyState.FAILED


class ModelMap:
    """Pods keyed by URL, refreshed from worker reports; the router's only view of the cluster."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._pods: dict[str, PodView] = {}
        self._reserved: dict[tuple[str, str], int] = {}  # (url, model) -> bytes of a load the router started
        self._suspect: dict[tuple[str, str], float] = {}  # (url, model) copies that just failed a request -> when
        self._loaded: dict[tuple[str, str], tuple[float, CopyView]] = {}  # copies the router saw loaded -> when
        self._unloaded: dict[tuple[str, str], float] = {}  # copies the router unloaded -> when
        self._started: dict[tuple[str, str], float] = {}  # loads the router started -> when (their load seconds)
        self._inflight: dict[tuple[str, str], int] = {}
        self._known: set[str] | None = None  # cache of known_models(), dropped on every pod change

    # --- updates -----------------------------------------------------------------

    def now(self) -> float:
        """The map's clock: stamp a status request with it before sending it."""
        return self.clock()

    def apply_status(self, url: str, status: WorkerStatus, node: str = "", asked_at: float | None = None,
                     draining: bool = False) -> None:
        """Replace what the map knows of `url` with the worker's own report, asked for at `asked_at`
        (default: now), keeping what the router learned itself after that moment."""
        asked_at = self.clock() if asked_at is None else asked_at
        copies = {c.id: CopyView.of(c) for c in status.models}
        catalog = {e.id: e.memory_bytes for e in status.catalog}
        canaries = {e.id: (e.canary, e.canary_weight) for e in status.catalog if e.canary}
        previous = self._pods.get(url)
        self._pods[url] = PodView(
            url=url,
            name=status.pod or url,
            node=node or (previous.node if previous else ""),
            ready=status.ready,
            budget_bytes=status.memory_budget_bytes,
            free_bytes=status.free_bytes,
            max_models=status.max_models,
            churn_guard_s=status.churn_guard_s,
            queued=status.queued_requests,
            copies=copies,
            catalog=catalog,
            draining=draining,
            canaries=canaries,
        )
        self._known = None
        pod = self._pods[url]
        self._keep_newer_knowledge(pod, asked_at)
        for key in [k for k in self._reserved if k[0] == url and pod.holds(k[1])]:
            del self._reserved[key]

    def _keep_newer_knowledge(self, pod: PodView, asked_at: float) -> None:
        """Lay what the router learned after `asked_at` over the report; forget what it superseded."""
        url = pod.url
        for key, at in list(self._suspect.items()):
            if key[0] == url and at <= asked_at:
                del self._suspect[key]
        for key, at in list(self._unloaded.items()):
            if key[0] != url:
                continue
            if at <= asked_at:
                del self._unloaded[key]
            elif (gone := pod.copies.pop(key[1], None)) is not None:
                pod.free_bytes += gone.bytes
        for key, (at, copy) in list(self._loaded.items()):
            if key[0] != url:
                continue
            if at <= asked_at:
                del self._loaded[key]
            elif key[1] not in pod.ready_models():
                previous = pod.copies.get(key[1])
                pod.copies[key[1]] = copy
                pod.free_bytes -= copy.bytes - (previous.bytes if previous is not None and previous.state != CopyState.FAILED else 0)

    def remove_pod(self, url: str) -> None:
        """Forget a pod at once (it stopped answering or left the cluster)."""
        self._pods.pop(url, None)
        self._known = None
        for table in (self._suspect, self._loaded, self._unloaded, self._reserved, self._started):
            for key in [k for k in table if k[0] == url]:
                del table[key]

    def mark_copy_failed(self, url: str, model: str) -> None:
        """No more requests for `model` to `url` until a report asked for after now."""
        self._suspect[(url, model)] = self.clock()
        self._loaded.pop((url, model), None)

    def reserve_load(self, url: str, model: str, nbytes: int) -> None:
        """Count a load the router started, before the worker reports it."""
        self._reserved[(url, model)] = nbytes
        self._started[(url, model)] = self.clock()

    def release_load(self, url: str, model: str) -> None:
        self._reserved.pop((url, model), None)

    def record_loaded(self, url: str, model: str, nbytes: int) -> None:
        """The worker answered our load: the copy is ready. Until its next report gives the measured
        figures, it is what the worker would report now: just loaded, wanted once."""
        pod = self._pods.get(url)
        self.release_load(url, model)
        self._suspect.pop((url, model), None)
        self._unloaded.pop((url, model), None)
        started = self._started.pop((url, model), None)
        if pod is not None and model not in pod.ready_models():
            previous = pod.copies.get(model)
            # What eviction plans need of it (a copy seen loading for 0 s would look free to evict).
            seconds = max(self.clock() - started if started is not None else 0.0,
                          previous.load_seconds if previous is not None else 0.0)
            copy = CopyView(model, CopyState.READY, nbytes, frequency=1.0, load_seconds=seconds)
            self._loaded[(url, model)] = (self.clock(), copy)
            pod.copies[model] = copy
            pod.free_bytes -= nbytes - (previous.bytes if previous is not None and previous.state != CopyState.FAILED else 0)

    def record_unloaded(self, url: str, model: str) -> None:
        """The router unloaded this copy: a report asked for before now no longer shows it."""
        pod = self._pods.get(url)
        self._loaded.pop((url, model), None)
        if pod is not None:
            self._unloaded[(url, model)] = self.clock()
            if model in pod.copies:
                pod.free_bytes += pod.copies.pop(model).bytes

    # --- in-flight counts (power of two choices) ------------------------------------------

    def begin_request(self, url: str, model: str) -> None:
        self._inflight[(url, model)] = self._inflight.get((url, model), 0) + 1

    def end_request(self, url: str, model: str) -> None:
        left = self._inflight.get((url, model), 1) - 1
        if left <= 0:
            self._inflight.pop((url, model), None)
        else:
            self._inflight[(url, model)] = left

    def inflight(self, url: str, model: str | None = None) -> int:
        if model is not None:
            return self._inflight.get((url, model), 0)
        return sum(n for (u, _), n in self._inflight.items() if u == url)

    def model_inflight(self, model: str) -> int:
        return sum(n for (_, m), n in self._inflight.items() if m == model)

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
        ready = [p for p in self._pods.values()
                 if p.ready and model in p.ready_models() and (p.url, model) not in self._suspect]
        staying = [p.url for p in ready if not p.draining]
        return staying or [p.url for p in ready]

    def loading_copies(self, model: str) -> list[str]:
        """URLs where `model` is being loaded (reported by the worker or started by the router)."""
        urls = {u for (u, m) in self._reserved if m == model and u in self._pods}
        urls |= {p.url for p in self._pods.values() if (c := p.copies.get(model)) and c.state == CopyState.LOADING}
        return sorted(urls)

    def free_bytes(self, url: str) -> int:
        """Free bytes of a pod less what the router's own unreported loads will take."""
        pod = self._pods[url]
        reserved = sum(n for (u, m), n in self._reserved.items() if u == url and not pod.holds(m))
        return pod.free_bytes - reserved

    def free_slots(self, url: str) -> int | None:
        """Copies the pod may still add under its model count limit (None: no limit), less the
        router's own unreported loads."""
        pod = self._pods[url]
        if pod.max_models is None:
            return None
        held = sum(1 for c in pod.copies.values() if c.state != CopyState.FAILED)
        reserved = sum(1 for (u, m) in self._reserved if u == url and not pod.holds(m))
        return pod.max_models - held - reserved

    def known_models(self) -> set[str]:
        """Every model some pod can load or holds."""
        if self._known is None:
            names: set[str] = set()
            for pod in self._pods.values():
                names |= set(pod.catalog) | set(pod.copies)
            self._known = names
        return set(self._known)

    def is_known(self, model: str) -> bool:
        if self._known is None:
            self.known_models()
        return model in self._known  # type: ignore[operator]

    def estimated_bytes(self, model: str, fallback: int = 0) -> int:
        """Measured size of an existing copy if any (measured wins), else the catalog estimate."""
        measured = [c.bytes for p in self._pods.values() if (c := p.copies.get(model)) and c.bytes > 0]
        if measured:
            return max(measured)
        estimates = [p.catalog[model] for p in self._pods.values() if p.catalog.get(model)]
        return max(estimates) if estimates else fallback

    def canary_of(self, model: str) -> tuple[str, int] | None:
        """`model`'s canary version (its id) and the percent of requests it takes, as the workers'
        catalogs say (they follow the model store, so an edited rollout reaches the router with the
        next reports); None when it has none."""
        for pod in self._pods.values():
            if model in pod.canaries:
                return pod.canaries[model]
        return None

    def pods_with_catalog(self, model: str) -> list[PodView]:
        """Ready pods that can load `model`."""
        return [p for p in self._pods.values() if p.ready and model in p.catalog]

    def copies_of(self, model: str) -> list[tuple[PodView, CopyView]]:
        return [(p, c) for p in self._pods.values() if (c := p.copies.get(model)) is not None]

    def urls(self) -> Iterable[str]:
        return list(self._pods)
