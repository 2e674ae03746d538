"""``GET /status``: the worker's report, in proportion to what changed since the caller last asked.

Every router asks every pod each second, and a whole report carries the
pod's catalog and every copy (434 KB at 2,000 models, 944 KB with 2,000
copies loaded), so reports cost the pod, the network and each router in
proportion to the catalog. Here each report is a page of a change log:

- ``ChangeLog`` keeps the current record of every copy and catalog entry,
  each stamped with the change count at which it last changed, in the
  order they changed. ``since(version, limit)`` is what changed after
  `version`, oldest first, at most `limit` (a bisect and the records).
- A caller sends the ``cursor`` of its last report (``?since=``); it gets
  what changed after it, the ids of what went, and a new cursor. A cursor
  the log cannot answer (first contact ``0``, a worker restarted since: a
  new ``epoch``, or older than the removals the log still remembers) gets
  the whole state instead (``delta: false``), page by page (``more``).
  Without ``since``, the report is the whole state in one answer, as before.
- What changed is learned, not searched for: the manager notes each copy it
  changes (changes.py); the store's ``generation`` says when the catalog may
  have. An idle pod answers from its cached figures.

Times in a record (seconds since last use, since loaded, since a failure)
and the decayed request count are kept as of when the record was built and
aged to the moment of each report (``hotset_common.status_follow.aged``, the
rule a reader holding an unchanged record ages it by too), so an unchanged
copy needs no new record.
The pod's own figures (readiness, free bytes, queue) are in every report.
"""
from __future__ import annotations

import bisect
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Protocol

from hotset_common import errors, status_follow, wire
from hotset_common.spec import ModelSpec
from hotset_worker.changes import ChangeFeed

COPY = "copy"
CATALOG = "catalog"
Key = tuple[str, str]  # (COPY or CATALOG, model id)
# The reason a READY copy whose backend is down is reported LOADING with.
BACKEND_DOWN = "its backend is not ready; the copy is loaded again when it is back"
DEFAULT_PAGE = 1000  # records per page of a whole state asked for with ?since=0
ROUTER_SEEN_S = 10.0  # a router replica that asked within this long is listed in reports


class ChangeLog:
    """Records by key, each with the change count at which it last changed; what changed after a count.

    Removals are kept as tombstones until there are many; dropping the oldest raises `floor`, and
    a cursor below it can only be answered with the whole state."""

    def __init__(self, epoch: str | None = None, max_tombstones: int = 4096) -> None:
        self.epoch = epoch or secrets.token_hex(6)
        self.version = 0
        self.floor = 0
        self.max_tombstones = max_tombstones
        self._current: dict[Hashable, tuple[int, Any]] = {}  # key -> (version, record; None: removed)
        self._versions: list[int] = []  # ascending; with _keys, the order of changes (stale ones skipped)
        self._keys: list[Hashable] = []
        self._tombstones = 0

    def get(self, key: Hashable) -> Any:
        entry = self._current.get(key)
        return entry[1] if entry is not None else None

    def put(self, key: Hashable, record: Any) -> None:
        """Record `key`'s new state (None: it went)."""
        previous = self._current.get(key)
        if record is None and (previous is None or previous[1] is None):
            return
        self.version += 1
        self._current[key] = (self.version, record)
        self._versions.append(self.version)
        self._keys.append(key)
        self._tombstones += (record is None) - (previous is not None and previous[1] is None)
        if len(self._versions) > 2 * len(self._current) + 1024:
            self._compact()
        if self._tombstones > self.max_tombstones:
            self._drop_tombstones()

    def answers(self, version: int) -> bool:
        """Whether what changed after `version` is still known (else only the whole state is)."""
        return self.floor <= version <= self.version

    def since(self, version: int, limit: int, removals: bool = True) -> tuple[list[tuple[Hashable, Any]], int, bool]:
        """(key, record) changed after `version`, oldest change first, at most `limit`; the version the
        next call starts from; whether more wait. `removals=False`: leave tombstones out (a whole state)."""
        found: list[tuple[Hashable, Any]] = []
        index = bisect.bisect_right(self._versions, version)
        reached = version
        while index < len(self._versions):
            key, at = self._keys[index], self._versions[index]
            entry = self._current[key]
            if entry[0] == at and (removals or entry[1] is not None):
                if len(found) == limit:
                    return found, reached, True
                found.append((key, entry[1]))
            reached = at
            index += 1
        return found, self.version, False

    def live(self) -> Iterable[tuple[Hashable, Any]]:
        return ((key, entry[1]) for key, entry in self._current.items() if entry[1] is not None)

    def _compact(self) -> None:
        """Forget the stale places in the order (a key that changed again is listed at its last change)."""
        ordered = sorted((entry[0], key) for key, entry in self._current.items())
        self._versions = [version for version, _ in ordered]
        self._keys = [key for _, key in ordered]

    def _drop_tombstones(self) -> None:
        """Forget the older half of the removals; a cursor from before them gets the whole state."""
        tombstones = sorted((entry[0], key) for key, entry in self._current.items() if entry[1] is None)
        for version, key in tombstones[: len(tombstones) // 2 + 1]:
            del self._current[key]
            self.floor = max(self.floor, version)
        self._tombstones = sum(1 for entry in self._current.values() if entry[1] is None)
        self._compact()


@dataclass(frozen=True)
class _Stamped:
    """A copy's record as it was when built (`at`, the report clock), aged when reported."""

    copy: wire.ModelCopy
    at: float

    def aged(self, now: float, half_life_s: float) -> wire.ModelCopy:
        return status_follow.aged(self.copy, now - self.at, half_life_s)


class ReportSource(Protocol):
    """What the report reads of the manager (manager.ModelManager)."""

    changes: ChangeFeed
    store: Any
    memory_budget: int
    max_models: int | None
    policy: Any
    demand_half_life_s: float
    preemptions: Iterable[wire.Preemption]  # the latest copies evicted for a higher priority

    def now(self) -> float: ...
    def view(self, model_id: str) -> Any: ...
    def failed_load(self, model_id: str) -> Any: ...
    def known_size(self, spec: ModelSpec) -> int: ...
    def used_bytes(self) -> int: ...
    def committed_bytes(self) -> int: ...
    def queued_requests(self) -> int: ...
    def waiting(self) -> list[tuple[str, int, float]]: ...
    def pinned_ids(self) -> list[str]: ...
    def loading_ids(self) -> list[str]: ...
    def load_progress(self, model_id: str) -> str: ...


class StatusReports:
    """Builds every ``GET /status`` answer of one worker from its change log."""

    def __init__(self, manager: ReportSource, pod_name: str, clock: Callable[[], float] | None = None,
                 page: int = DEFAULT_PAGE, entry_of: Callable[[ModelSpec], wire.CatalogEntry] | None = None,
                 grpc_port: int | None = None) -> None:
        self.manager = manager
        self.grpc_port = grpc_port  # where this worker serves OIP v2 over gRPC; None: nowhere
        # The vLLM engines' own figures (engine_load.EngineLoads.figures), in every report.
        self.engine_loads: Callable[[], list[wire.EngineLoad]] = list
        self.entry_of = entry_of or (lambda spec: catalog_entry(spec, manager.known_size(spec)))
        self.pod_name = pod_name
        self.clock = clock or manager.now  # the clock of the times in the manager's views
        self.page = page
        self.log = ChangeLog()
        self._specs: dict[str, ModelSpec] = {}  # the store as last read
        self._generation: object = object()  # the store's generation then (never equal at first)
        self._pinned: list[str] = []
        self._sums: tuple[int, int, int] = (-1, 0, 0)  # (feed count, used, committed)
        self._routers: dict[str, float] = {}
        self._down: frozenset[str] = frozenset()  # frameworks whose backend is not ready now

    # --- what changed ----------------------------------------------------------------

    def catch_up(self) -> None:
        """Bring the log up to date: the catalog if the store moved, then every copy the manager touched."""
        generation = self.manager.store.generation
        if generation is None or generation != self._generation:
            self._read_catalog()
            self._generation = generation
        now = self.clock()
        for model_id in self.manager.changes.drain():
            self.log.put((COPY, model_id), self._copy_record(model_id, now))
            spec = self._specs.get(model_id)
            if spec is not None:  # a load measured it: the catalog's size follows
                self._put_entry(spec)
        for model_id in self.manager.loading_ids():  # a download's progress moves with no change to the copy
            previous = self.log.get((COPY, model_id))
            record = self._copy_record(model_id, now)
            if record is not None and (previous is None or previous.copy.progress != record.copy.progress):
                self.log.put((COPY, model_id), record)

    def _read_catalog(self) -> None:
        listed = {spec.id: spec for spec in self.manager.store.list()}
        changed = [spec for key, spec in listed.items() if self._specs.get(key) is not spec]
        gone = [key for key in self._specs if key not in listed]
        self._specs = listed
        for spec in changed:
            self._put_entry(spec)
        for key in gone:
            self.log.put((CATALOG, key), None)
        # Pinned-ness and versions come from the specs: the copies of what changed are reported again.
        self.manager.changes.touch_all([spec.id for spec in changed] + gone)
        self._pinned = self.manager.pinned_ids()

    def _put_entry(self, spec: ModelSpec) -> None:
        entry = self.entry_of(spec)
        if self.log.get((CATALOG, spec.id)) != entry:
            self.log.put((CATALOG, spec.id), entry)

    def _copy_record(self, model_id: str, now: float) -> _Stamped | None:
        view = self.manager.view(model_id)
        if view is not None:
            copy = copy_of(view, self.manager.load_progress(model_id))
            if copy.state is wire.CopyState.READY and copy.framework in self._down:
                copy = copy.model_copy(update={"state": wire.CopyState.LOADING, "reason": BACKEND_DOWN})
            return _Stamped(copy, now)
        failed = self.manager.failed_load(model_id)
        if failed is not None:
            framework = spec.framework.value if (spec := self._specs.get(model_id)) is not None else ""
            return _Stamped(failed_copy(failed, framework), now)
        return None

    def pinned_ids(self) -> list[str]:
        """The pinned models (readiness waits for them), read again only when the store moved."""
        generation = self.manager.store.generation
        if generation is None or generation != self._generation:
            return self.manager.pinned_ids()
        return self._pinned

    # --- the report -------------------------------------------------------------------

    def report(self, readiness: dict[str, Any], since: str | None, limit: int | None = None,
               router: str | None = None) -> wire.WorkerStatus:
        """The answer to ``GET /status?since=&limit=`` (see the module docstring)."""
        cursor = wire.StatusCursor.parse(since) if since is not None else None
        self._note_router(router)
        self._note_down(frozenset(readiness.get("down", ())))
        self.catch_up()
        now = self.clock()
        if since is None:
            records, version, more, delta = list(self.log.live()), self.log.version, False, False
        elif cursor is not None and cursor.epoch == self.log.epoch and self.log.answers(cursor.version):
            found, version, more = self.log.since(cursor.version, limit or self.page)
            records, delta = found, True
        else:
            found, version, more = self.log.since(0, limit or self.page, removals=False)
            records, delta = found, False
        return self._shape(readiness, records, wire.StatusCursor(self.log.epoch, version), delta, more, now)

    def _shape(self, readiness: dict[str, Any], records: list[tuple[Any, Any]], cursor: wire.StatusCursor,
               delta: bool, more: bool, now: float) -> wire.WorkerStatus:
        half_life = self.manager.demand_half_life_s
        models: list[wire.ModelCopy] = []
        catalog: list[wire.CatalogEntry] = []
        removed_models: list[str] = []
        removed_catalog: list[str] = []
        for (kind, model_id), record in records:
            if kind == COPY and record is not None:
                models.append(record.aged(now, half_life))
            elif kind == COPY:
                removed_models.append(model_id)
            elif record is not None:
                catalog.append(record)
            else:
                removed_catalog.append(model_id)
        if not delta and not more:  # a whole state in one answer: in id order, as it always was
            models.sort(key=lambda copy: copy.id)
            catalog.sort(key=lambda entry: entry.id)
        used, committed = self._memory_sums()
        manager = self.manager
        return wire.WorkerStatus(
            pod=self.pod_name,
            ready=readiness["ready"],
            triton_ready=readiness["triton_ready"],
            memory_budget_bytes=manager.memory_budget,
            used_bytes=used,
            free_bytes=max(0, manager.memory_budget - committed),
            max_models=manager.max_models,
            churn_guard_s=manager.policy.churn_guard_s,
            queued_requests=manager.queued_requests(),
            waiting=[wire.WaitingModel(id=model, requests=n, waited_s=waited) for model, n, waited in manager.waiting()],
            models=models,
            catalog=catalog,
            cursor=str(cursor),
            delta=delta,
            more=more,
            removed_models=removed_models,
            removed_catalog=removed_catalog,
            routers=sorted(self._routers),
            demand_half_life_s=half_life,
            preemptions=list(manager.preemptions),
            grpc_port=self.grpc_port,
            engines=self.engine_loads(),
        )

    def _memory_sums(self) -> tuple[int, int]:
        """Used and committed bytes, summed over the copies again only when one changed."""
        count = self.manager.changes.count
        if self._sums[0] != count:
            self._sums = (count, self.manager.used_bytes(), self.manager.committed_bytes())
        return self._sums[1], self._sums[2]

    def _note_down(self, down: frozenset[str]) -> None:
        """A backend that went down or came back changes how its READY copies are reported (LOADING
        while it is down): those copies are reported again, which walks the copies only then."""
        flipped = down ^ self._down
        if not flipped:
            return
        self._down = down
        now = self.clock()
        for (kind, model_id), record in list(self.log.live()):
            if kind == COPY and record is not None and record.copy.framework in flipped:
                self.log.put((COPY, model_id), self._copy_record(model_id, now))

    def _note_router(self, router: str | None) -> None:
        now = self.clock()
        if router:
            if len(router) > 200:
                raise errors.BadInput(f"{wire.ROUTER_ID_HEADER} is longer than 200 characters")
            self._routers[router] = now
        for name, seen in list(self._routers.items()):
            if now - seen > ROUTER_SEEN_S:
                del self._routers[name]


def copy_of(view: Any, progress: str = "") -> wire.ModelCopy:
    """A manager.CopyView as the wire says it (`progress`: a LOADING copy's download, if any)."""
    return wire.ModelCopy(
        id=view.model_id, framework=view.framework, state=view.state, bytes=view.bytes, pinned=view.pinned,
        inflight=view.inflight, last_used_s=view.last_used_s, loaded_at_s=view.loaded_at_s,
        load_seconds=view.load_seconds, frequency=view.frequency, queued=view.queued, version=view.version,
        reason=view.reason, progress=progress, priority=view.priority,
    )


def failed_copy(failed: Any, framework: str) -> wire.ModelCopy:
    """A remembered failed load (manager.FailedLoadView): a FAILED copy holding nothing, never ready."""
    return wire.ModelCopy(id=failed.model_id, framework=framework, state=wire.CopyState.FAILED, reason=failed.reason,
                          failed_at_s=failed.failed_at_s, pinned=failed.pinned, failure=failed.failure)


def catalog_entry(spec: ModelSpec, known_bytes: int) -> wire.CatalogEntry:
    canary = spec.canary_variant()
    return wire.CatalogEntry(id=spec.id, framework=spec.framework.value, memory_bytes=known_bytes,
                             name=spec.name, type=spec.task.value, version=spec.version, description=spec.description,
                             base_model=spec.base_model, canary=canary.id if canary else "",
                             canary_weight=canary.variant_weight if canary else 0,
                             latency_class=spec.latency_class, load_timeout_s=spec.load_timeout_seconds or 0.0,
                             priority=spec.priority)
