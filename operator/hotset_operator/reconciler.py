"""ServedModels, reconciled as they change: admission, the catalogs, their status, their groups.

kopf calls ``changed(key)`` on every event of a ServedModel (``handlers/changes.py``);
the object's entry is already in the index. One task then, in passes:

1. **admission**: a model created after every model judged so far continues
   the last pass (O(1), ``admission.Fold``); an edit, a deletion or a quota
   change is one pass over every model, off the event loop. Never one pass
   per model, never on a timer. ``hotset_operator_admission_decisions_total``
   counts the decisions.
2. for each model whose decision, spec, copies or status changed (and only
   those): its entry in its pool's **catalog** (``catalog.py``, served by
   ``feed.py``), its **dedicated group** (``dedicated.py``), and its
   **status** (``model_status.py``), queued for ``writes.py`` only when it
   differs from what the object says;
3. the **quotas'** status where their use changed (``quota_status.py``).

A restart therefore judges every model once, publishes the catalogs, finds
every status already true, and writes nothing. Nothing here waits on the
network: writes are queued, dedicated groups' calls run in their own tasks,
and a pass yields to the event loop between batches of models.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from hotset_common import model_store
from hotset_common.spec import ModelSpec, Placement
from hotset_common.wire import Preemption
from hotset_operator import admission, approval, index, kinds, model_status, workloads
from hotset_operator.admission import Decision
from hotset_operator.approvals import Approvals
from hotset_operator.catalog import Catalogs, StoreKey
from hotset_operator.config import OperatorConfig
from hotset_operator.dedicated import DedicatedGroups, model_ref
from hotset_operator.fleet import Fleet, ModelKey
from hotset_operator.index import Key, ModelEntry
from hotset_operator.metrics import OperatorMetrics
from hotset_operator.pool_contents import PoolContents
from hotset_operator.quota_status import QuotaStatus
from hotset_operator.served import ServedModels
from hotset_operator.writes import Writes

log = logging.getLogger(__name__)
SETTLE_S = 0.05  # a burst of events is taken in one pass
RELIST_S = 5.0
BATCH = 32  # models reconciled between two yields to the event loop (a few ms)


class ModelReconciler:
    def __init__(self, config: OperatorConfig, metrics: OperatorMetrics, catalogs: Catalogs, writes: Writes,
                 fleet: Fleet, served: ServedModels, model_quotas: Mapping[Any, Any],
                 dedicated: DedicatedGroups, quota_status: QuotaStatus, approvals: Approvals | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.catalogs = catalogs
        self.writes = writes
        self.fleet = fleet
        self.served = served  # every ServedModel as of its last event
        self.model_quotas = model_quotas  # kopf index: namespace -> Quota
        self.dedicated = dedicated
        self.quota_status = quota_status
        self.approvals = approvals  # None: no API to check approvals with (nothing is ever approved)
        self.decisions: dict[Key, Decision] = {}
        self.ready = False  # every model judged once since start: the feed may answer
        self._fold: admission.Fold | None = None
        self._basis: dict[Key, tuple[Any, ...]] = {}  # what each decision was made on
        self._reads: dict[Key, tuple[Any, ...]] = {}  # what admission read of each model then
        self._full = True  # a pass over every model is due
        self._appended: list[Key] = []  # created after everything judged: the fold continues with them
        self._dirty: set[Key] = set()
        self._published: dict[Key, tuple[StoreKey, tuple[Any, ...], bytes]] = {}
        self._written: dict[Key, dict[str, Any]] = {}  # status fields queued and not yet seen back
        self._by_model: dict[str, Key] = {}  # accepted model id -> its object (reports name ids)
        self._pool_specs: dict[str, dict[str, ModelSpec]] = {}  # pool namespace -> its shared models
        self._dedicated_models: dict[Key, None] = {}
        self._serving: dict[Key, ModelSpec] = {}  # served instead of the spec: approved last, a change waiting
        self.pool_versions: dict[str, int] = {}  # pool namespace -> bumped when a model joins or leaves
        # What each namespace's pods need from their models (sidecar, image volumes, credentials).
        self.contents = PoolContents()
        self._wake = asyncio.Event()
        self.passes = 0

    # --- what kopf's handlers and the pool loop tell it -----------------------------------

    def changed(self, key: Key) -> None:
        """An event of the ServedModel `key` (its entry is already indexed, or gone)."""
        entry = self.model(key)
        judged = self._basis.get(key)
        if entry is None:
            if judged is not None:
                self._full = True  # a deletion can free a name, a quota, dedicated pods
        elif entry.basis != judged:
            fold = self._fold
            if judged is not None and self._reads.get(key) == entry.admission_key:
                self._basis[key] = entry.basis  # nothing admission reads changed: every decision stands
            elif judged is None and not self._full and fold is not None and fold.follows(entry):
                self._appended.append(key)
            else:
                self._full = True
        if entry is not None and (written := self._written.get(key)) is not None and all(
                entry.status.get(k) == v for k, v in written.items()):
            del self._written[key]  # the object says what was written
        self._dirty.add(key)
        self._wake.set()

    def indexed(self) -> None:
        """kopf handed over an event: every index is complete (the first pass may run)."""
        self._wake.set()

    def quotas_changed(self) -> None:
        self._full = True
        self._wake.set()

    def copies_changed(self, models: set[ModelKey]) -> None:
        """What the workers report changed for these (namespace, model) pairs."""
        for _, model in models:
            if (key := self._by_model.get(model)) is not None:
                self._dirty.add(key)
        self._wake.set()

    def blocked_changed(self, key: Key) -> None:
        self._dirty.add(key)
        self._wake.set()

    def preempted(self, pod: str, preemption: Preemption) -> None:
        """A worker evicted a copy for the load of a model of higher priority: an Event on each of
        the two ServedModels, naming the other (as the scheduler does for a preempted pod)."""
        victim, by = self._by_model.get(preemption.model), self._by_model.get(preemption.by)
        if victim is not None and (entry := self.model(victim)) is not None:
            self.writes.event(model_ref(entry), "Normal", "Preempted", (
                f"its copy on pod {pod} (priority {preemption.priority}) was evicted for the load of "
                f"{preemption.by} (priority {preemption.by_priority})"))
        if by is not None and (entry := self.model(by)) is not None:
            self.writes.event(model_ref(entry), "Normal", "Preempting", (
                f"its load on pod {pod} (priority {preemption.by_priority}) evicted the copy of "
                f"{preemption.model} (priority {preemption.priority})"))

    def status_not_written(self, key: Key) -> None:
        self._written.pop(key, None)
        self._dirty.add(key)
        self._wake.set()

    # --- what the pool loop reads ---------------------------------------------------------

    def model(self, key: Key) -> ModelEntry | None:
        return self.served.get(key)

    def served_entry(self, entry: ModelEntry) -> ModelEntry:
        """`entry` with the spec it is served with (the one approved last while a change waits)."""
        serving = self._serving.get(entry.key)
        return entry if serving is None else dataclasses.replace(entry, spec=serving)

    def pool_specs(self, namespace: str) -> dict[str, ModelSpec]:
        """The accepted shared models of the pool in `namespace`."""
        return self._pool_specs.get(namespace, {})

    def pool_namespaces(self) -> list[str]:
        return sorted(namespace for namespace, specs in self._pool_specs.items() if specs)

    def dedicated_models(self) -> list[ModelEntry]:
        """The accepted dedicated models, as indexed now (their wanted-at annotation included)."""
        return [self.served_entry(entry) for key in self._dedicated_models if (entry := self.model(key)) is not None]

    def oldest_shared(self, namespace: str, count: int) -> list[ModelEntry]:
        """The `count` oldest accepted shared models of `namespace` (a namespace pool's owners)."""
        found = [self.served_entry(entry) for name in self._pool_specs.get(namespace, {})
                 if (entry := self.model((namespace, name))) is not None]
        return sorted(found, key=admission.order_of)[:count]

    # --- the passes ------------------------------------------------------------------------

    async def run(self, relist: Callable[[], Awaitable[None]]) -> None:
        """Reconcile forever: a pass after each burst of changes (cancel to stop), the first once
        every ServedModel that existed at start has been seen (`relist`: LIST them again)."""
        await self._first_listing(relist)
        while True:
            await self._wake.wait()
            await asyncio.sleep(SETTLE_S)
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:  # the loop must outlive one bad pass; everything is retried
                log.exception("reconciling ServedModels failed; retrying")
                self._full = True
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _first_listing(self, relist: Callable[[], Awaitable[None]]) -> None:
        """Until kopf has handed over every ServedModel that a LIST at start found. One deleted
        between that LIST and kopf's own would never come: after RELIST_S without progress, they
        are listed again, and what is gone is no longer waited for."""
        await relist()
        missing, since = len(self.served.missing()), time.monotonic()
        while missing:
            await asyncio.sleep(0.1)
            now = len(self.served.missing())
            if now < missing:
                missing, since = now, time.monotonic()
            elif time.monotonic() - since > RELIST_S:
                log.info("%d ServedModels listed at start not seen yet; listing again", now)
                await relist()
                missing, since = len(self.served.missing()), time.monotonic()
        self._wake.set()

    async def reconcile(self) -> None:
        """One pass: admission if due, then every model that changed."""
        started = time.perf_counter()
        admitted, judged = await self._admit()
        dirty, self._dirty = self._dirty, set()
        keys = sorted(dirty)
        for start in range(0, len(keys), BATCH):
            for key in keys[start:start + BATCH]:
                self._reconcile_one(key)
            await asyncio.sleep(0)
        if admitted and self._fold is not None:
            self.quota_status.update(self._fold.result, index.values(self.model_quotas))
        self.passes += 1
        self.ready = self.ready or self._fold is not None
        if admitted or keys:
            log.debug("pass %d: %d judged, %d reconciled in %.3fs", self.passes, judged, len(keys),
                      time.perf_counter() - started)

    async def _admit(self) -> tuple[bool, int]:
        """Admission as due: whether it ran, and how many models it judged."""
        if self._full:
            self._full, self._appended = False, []
            entries = self.served.values()
            quotas = index.quotas(self.model_quotas)
            fold, changed, basis, reads = await asyncio.to_thread(self._judge_all, entries, quotas, dict(self.decisions))
            self._fold, self._basis, self._reads = fold, basis, reads
            self.decisions = fold.result.decisions
            self._dirty |= changed
            self.metrics.admission_passes.labels("all").inc()
            self.metrics.admission_decisions.inc(fold.judged)
            return True, fold.judged
        if not self._appended:
            return False, 0
        keys, self._appended = dict.fromkeys(self._appended), []
        found = [entry for key in keys if (entry := self.model(key)) is not None and key not in self._basis]
        alive = sorted((entry for entry in found if not entry.deleting), key=admission.order_of)
        fold = self._fold
        assert fold is not None
        if alive and not fold.follows(alive[0]):
            self._full = True  # one sorts before a model judged since: a full pass, now
            return await self._admit()
        fold.extend(alive)
        for entry in found:
            self._basis[entry.key] = entry.basis
            self._reads[entry.key] = entry.admission_key
            self._dirty.add(entry.key)
        self.metrics.admission_passes.labels("appended").inc()
        self.metrics.admission_decisions.inc(len(alive))
        return True, len(alive)

    def _judge_all(self, entries: list[ModelEntry], quotas: dict[str, list[Any]], before: dict[Key, Decision]
                   ) -> tuple[admission.Fold, set[Key], dict[Key, tuple[Any, ...]], dict[Key, tuple[Any, ...]]]:
        """Every model judged (on a thread): the fold, the keys whose decision changed, what each
        decision was made on and what admission read of it."""
        fold = admission.fold(entries, quotas, self.config, {key for key, d in before.items() if d.accepted})
        after = fold.result.decisions
        changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
        return (fold, changed, {entry.key: entry.basis for entry in entries},
                {entry.key: entry.admission_key for entry in entries})

    # --- one model ---------------------------------------------------------------------------

    def _reconcile_one(self, key: Key) -> None:
        entry = self.model(key)
        if entry is not None and self._basis.get(key) != entry.basis:
            self._dirty.add(key)  # changed since it was judged: judged in the next pass, then reconciled here
            self._wake.set()
            return
        decision = self.decisions.get(key) if entry is not None else None
        if entry is None or decision is None:  # gone, or being deleted
            self._publish(key, None, False)
            self._forget(key, gone=entry is None)
            if self.approvals is not None:
                self.approvals.forget(key)
            return
        if decision.serving is not None:
            self._serving[key] = decision.serving
            entry = dataclasses.replace(entry, spec=decision.serving)
        else:
            self._serving.pop(key, None)
        if decision.accepted and (blocked := self.dedicated.blocked.get(key)) is not None:
            decision = Decision(False, admission.INVALID_SPEC, blocked)
            self.dedicated.reconcile(entry, True)  # checked again as it changes
        else:
            self.dedicated.reconcile(entry, decision.accepted)
        self._publish(key, entry, decision.accepted)
        granted = None
        if self.approvals is not None and decision.approval in (approval.State.PENDING, approval.State.WAITING):
            granted = self.approvals.granted(entry)
        self._write_status(entry, decision, granted)

    def _forget(self, key: Key, gone: bool) -> None:
        self._serving.pop(key, None)
        self._written.pop(key, None)
        self.dedicated.forget(key)
        if gone:
            self._basis.pop(key, None)
            self._reads.pop(key, None)

    def _store_of(self, entry: ModelEntry, spec: ModelSpec) -> StoreKey:
        if spec.placement is Placement.DEDICATED:
            return entry.namespace, workloads.catalog_store(spec.id)
        return self.config.pool_namespace(entry.namespace), workloads.catalog_store(None)

    def _publish(self, key: Key, entry: ModelEntry | None, accepted: bool) -> None:
        """`entry`'s place in its pool's catalog: its entry when accepted, none otherwise."""
        held = self._published.get(key)
        spec = entry.spec if entry is not None else None
        if entry is None or spec is None or not accepted:
            self.metrics.model_gone(*key)
            if held is not None:
                self.catalogs.remove(held[0], key[1])
                del self._published[key]
                self._unlist(key, held[0])
            return
        self.metrics.model_accepted(key[0], key[1], spec)
        store = self._store_of(entry, spec)
        if held is not None and held[0] == store and held[1] == entry.basis:
            return  # the same spec in the same catalog: nothing to encode
        encoded = model_store.encode_entry(spec)
        if held is not None and held[0] != store:
            self.catalogs.remove(held[0], key[1])
            self._unlist(key, held[0])
        self.catalogs.put(store, key[1], encoded)
        self.contents.put(store[0], key[1], spec, shared=spec.placement is not Placement.DEDICATED)
        self._published[key] = (store, entry.basis, encoded)
        self._by_model[spec.id] = key
        if spec.placement is Placement.DEDICATED:
            self._dedicated_models[key] = None
        else:
            members = self._pool_specs.setdefault(store[0], {})
            if spec.id not in members:
                self.pool_versions[store[0]] = self.pool_versions.get(store[0], 0) + 1
            members[spec.id] = spec

    def _unlist(self, key: Key, store: StoreKey) -> None:
        self.contents.remove(store[0], key[1])
        if self._by_model.get(key[1]) == key:
            del self._by_model[key[1]]
        self._dedicated_models.pop(key, None)
        if self._pool_specs.get(store[0], {}).pop(key[1], None) is not None:
            self.pool_versions[store[0]] = self.pool_versions.get(store[0], 0) + 1

    def _report_namespace(self, entry: ModelEntry, spec: ModelSpec | None) -> str:
        """Where a model's copies live: its pool's namespace (shared) or its own (dedicated)."""
        if spec is not None and spec.placement is Placement.DEDICATED:
            return entry.namespace
        return self.config.pool_namespace(entry.namespace)

    def _write_status(self, entry: ModelEntry, decision: Decision, granted: approval.Request | None = None) -> None:
        written = self._written.get(entry.key)
        seen = entry if written is None else _with_status(entry, {**entry.status, **written})
        where = self._report_namespace(entry, entry.spec)
        problems = self.fleet.problems_of(entry.namespace, entry.name) if (
            entry.spec is not None and entry.spec.placement is Placement.DEDICATED) else []
        change = model_status.desired(seen, decision, self.fleet.copies_of(where, entry.name), problems, self.config,
                                      granted)
        if not change.fields:
            return
        self._written[entry.key] = {**(written or {}), **change.fields}
        self.writes.status(kinds.SERVED_MODELS, entry.namespace, entry.name, change.fields)
        for event in change.events:
            self.writes.event(model_ref(entry), event.type, event.reason, event.message)


def _with_status(entry: ModelEntry, status: dict[str, Any]) -> ModelEntry:
    return dataclasses.replace(entry, status=status)
