"""ModelManager: the only holder of "what is in memory" in a worker pod.

The state is a synchronous table (copy_table.py: copies, their named state
changes and an invariant check), the admission queue (admission.py) and the
rollout decisions (rollouts.py); this module is the async flow around them
(requests, loads and unloads on threads, deadlines on the one injected
clock, clock.py), and the table's single writer.

Guarantees, and how they are kept:

- **Capacity in bytes.** Each copy counts its best known size while it loads
  (the size measured at its last load, else the spec's estimate) and its
  measured size (``FrameworkWorker.measured_bytes()``) once loaded.
  ``max_models`` optionally caps the count as well.
- **One load per model.** The first request creates the copy in state LOADING
  with a future; every later request for it awaits that same future.
- **Requests wait for room instead of failing.** A request whose model has no
  copy and cannot be admitted now (every slot is loading, promised away, or
  pinned) waits in a bounded admission queue, first come first served, until
  room frees up or its deadline passes. Requests for the same model share one
  place in the queue. ``NoCapacity`` (503 with Retry-After) is the last
  resort and says which of these it is: the queue is full, the deadline
  cannot be met (the model's last load took longer than the time left) or
  passed while waiting, or the model can never fit beside the pinned ones.
- **Admission control.** A load a request asked for, whose copy would save
  fewer reload seconds (demand x load seconds) than the copies it would
  displace, serves the requests waiting for it and is unloaded again, and the
  more valuable copies stay (TinyLFU's idea, with reload seconds as the
  measure). Its demand is remembered, so a model that becomes popular is kept
  once it is worth it. Explicit loads (the API, pinned models) always stay.
- **Thrash-aware victims.** Victims come from the shared cost model
  (``hotset_common.eviction``: reload seconds saved per byte, churn
  guard and in-flight requests folded into the order). A copy that requests
  are waiting for is never chosen before they are served, so each swap
  serves a whole batch.
- **A failed load changes nothing (load first, evict after).** Admission
  *promises* victims (they keep serving meanwhile, and no other load can take
  them); they are evicted only once the load succeeded and the new copy was
  measured. So missing or corrupt files, an unknown framework or a down
  sidecar evict nothing, and the promise is released. The price: while a load
  runs, memory may exceed the budget by that model's size, so on a GPU the
  budget should leave room for the largest model on top. A model whose
  measured size exceeds the budget, or (measured exactly) the ``memory`` its
  spec declares, is unloaded again and refused with both figures.
- **Spec changes are rollouts.** A READY copy whose spec changed in what
  decides its weights (``ModelSpec.load_key``: framework, task, source,
  version) keeps serving while the new version loads and warms up beside it,
  then the new copy takes over and the old one drains and unloads. The old
  copy counts until it is gone, so the room beside it is made first (evictions
  before the load, or the rollout waits): a rollout never takes the pod over
  its budget (rollouts.py). Every answer names the version of the copy that
  computed it. A failed rollout leaves the old copy serving, with the reason.
- **Warm-up before ready.** A spec's ``warmup`` inputs run through a new copy
  while it is still LOADING (on the load thread); a failing one fails the load
  (``WarmupFailed``: nothing evicted) and no request reaches a copy before they
  all ran.
- **Loads never block loaded models.** ``load()``/``unload()`` run on a small
  thread pool of their own; inference runs on another (``asyncio.to_thread``).
  All table changes happen on the event loop between awaits, so they need no lock.
  A request for a READY copy takes it without awaiting anything (the warm path).
- **Pinned models are never evicted** (nor unloaded through the API).
- **No unload under a request.** A victim stops taking new requests at once
  (state UNLOADING) and its ``unload()`` runs only after its in-flight
  requests finished; its bytes count until then, so the next admission waits
  for the memory to be free. A request for it meanwhile waits for the unload
  and then loads it again.
- **A failed load is remembered, not retried on every request.** The last
  failure per model is reported as a FAILED copy of 0 bytes until a later
  load succeeds or the model is unloaded. For ``failure_backoff_s`` after it,
  a request gets the same error at once; a sidecar that was down
  (BackendUnavailable) is re-checked at once instead.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import copy as copying
import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Iterable, Protocol

from hotset_common import errors
from hotset_common.budget import BudgetMode
from hotset_common.eviction import Candidate, DecayedCount, EvictionPolicy, eviction_cost
from hotset_common.quantity import format_bytes
from hotset_common.spec import Framework, ModelSpec
from hotset_common.wire import CopyState, Preemption
from hotset_worker import engine, memory, rollouts
from hotset_worker.admission import AdmissionQueue
from hotset_worker.changes import ChangeFeed
from hotset_worker.clock import Clock, as_clock, wait_until
from hotset_worker.copy_table import Copy, CopyTable
from hotset_worker.frameworks import sources
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext
from hotset_worker.store import ModelStore

log = logging.getLogger(__name__)

Preflight = Callable[[ModelSpec], Awaitable[None]]
HeldModels = Callable[[], Awaitable["set[str] | None"]]
WorkerFactory = Callable[[ModelSpec, WorkerContext], FrameworkWorker]

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_QUEUE = 256
PREEMPTIONS_KEPT = 16  # preemptions a report carries
ROOM_WAIT_S = 60.0  # longest a prepared load waits for room under a hard budget before it fails


class ManagerObserver(Protocol):
    """What the manager reports as it works (the worker's Prometheus metrics implement it)."""

    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None: ...

    def warmup_finished(self, spec: ModelSpec, seconds: float) -> None: ...

    def model_evicted(self, spec: ModelSpec) -> None: ...

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None: ...

    def memory_used(self, used: int) -> None: ...

    def queue_length(self, spec: ModelSpec, waiting: int) -> None: ...

    def queue_left(self, spec: ModelSpec, seconds: float, outcome: str) -> None: ...

    def copy_added(self, spec: ModelSpec) -> None: ...

    def copy_gone(self, spec: ModelSpec) -> None: ...


class _NoObserver:
    def copy_added(self, spec: ModelSpec) -> None:
        pass

    def copy_gone(self, spec: ModelSpec) -> None:
        pass

    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None:
        pass

    def warmup_finished(self, spec: ModelSpec, seconds: float) -> None:
        pass

    def model_evicted(self, spec: ModelSpec) -> None:
        pass

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None:
        pass

    def memory_used(self, used: int) -> None:
        pass

    def queue_length(self, spec: ModelSpec, waiting: int) -> None:
        pass

    def queue_left(self, spec: ModelSpec, seconds: float, outcome: str) -> None:
        pass


@dataclass
class RequestTiming:
    """Where one request's time went, for the standard ``Server-Timing`` answer header."""

    queue_s: float = 0.0  # waiting for room in the admission queue (and for a concurrency slot)
    load_s: float = 0.0  # waiting for its model's load (its own or one it joined)
    infer_s: float = 0.0  # the framework's inference (a batched one: the whole batch's pass)
    batch_s: float = 0.0  # waiting for the model's batch to start (dynamic batching)
    version: str = ""  # the version of the copy that served it (during a rollout, maybe not the store's)

    def header(self) -> str:
        """``queue;dur=0.0, load;dur=41.3, batch;dur=0.4, infer;dur=3.2`` (milliseconds, as the header wants)."""
        return (f"queue;dur={self.queue_s * 1000:.1f}, load;dur={self.load_s * 1000:.1f}, "
                f"batch;dur={self.batch_s * 1000:.1f}, infer;dur={self.infer_s * 1000:.1f}")


@dataclass(frozen=True)
class CopyView:
    """A read-only snapshot of one copy, for /status, /models and the repository index."""

    model_id: str
    framework: str
    state: CopyState
    bytes: int
    pinned: bool
    inflight: int
    last_used_s: float
    loaded_at_s: float
    load_seconds: float = 0.0
    frequency: float = 0.0
    queued: int = 0
    version: str = ""
    reason: str = ""
    priority: int = 0


@dataclass(frozen=True)
class FailedLoadView:
    """A remembered load failure, for /status (a FAILED copy) and the repository index."""

    model_id: str
    reason: str
    failed_at_s: float  # seconds since it failed
    pinned: bool
    failure: str = "LoadFailed"  # WarmupFailed when the model loaded but its warm-up failed


class ModelManager:
    """The async flow around the copy table: requests, loads, unloads, rollouts. The table's only
    writer; every change happens on the event loop between awaits, so there is no lock."""

    def __init__(
        self,
        store: ModelStore,
        context: WorkerContext,
        memory_budget: int,
        *,
        max_models: int | None = None,
        policy: EvictionPolicy | None = None,
        pinned: Iterable[str] = (),
        clock: Clock | Callable[[], float] | None = None,
        observer: ManagerObserver | None = None,
        preflight: Preflight | None = None,
        create_worker: WorkerFactory = engine.create,
        load_threads: int = 2,
        failure_backoff_s: float = 5.0,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_queue: int = DEFAULT_MAX_QUEUE,
        demand_half_life_s: float | None = None,
        admission_control: bool = True,
        budget_mode: BudgetMode = BudgetMode.LOAD_FIRST,
    ) -> None:
        if memory_budget <= 0:
            raise ValueError(f"memory budget must be positive, got {memory_budget}")
        if max_models is not None and max_models < 1:
            raise ValueError(f"max models must be at least 1, got {max_models}")
        if failure_backoff_s < 0:
            raise ValueError(f"failed-load back-off must not be negative, got {failure_backoff_s}")
        if request_timeout_s <= 0:
            raise ValueError(f"request timeout must be positive, got {request_timeout_s}")
        self.store = store
        self.context = context
        self.policy = policy or EvictionPolicy()
        self.failure_backoff_s = failure_backoff_s
        self.request_timeout_s = request_timeout_s
        self.admission_control = admission_control
        self.budget_mode = budget_mode
        self._freed: list[asyncio.Future[None]] = []  # hard budget: loads waiting for memory to be given back
        self.clock = as_clock(clock)
        self._pinned = frozenset(pinned)
        self._observer = observer or _NoObserver()
        self._preflight = preflight
        self._create_worker = create_worker
        self.table = CopyTable(memory_budget, max_models, self.policy, self.is_pinned, self.clock.now,
                               demand_half_life_s or DecayedCount().half_life_s)
        self.queue = AdmissionQueue(max_queue)
        self._tasks: set[asyncio.Task[None]] = set()
        self._rollouts_waiting: set[str] = set()  # stale copies whose new version waits for room beside them
        self._load_pool = concurrent.futures.ThreadPoolExecutor(load_threads, thread_name_prefix="model-load")
        # The latest copies evicted for a higher priority's load: reported (status_report.py) for the
        # operator's Events; a few suffice, it reads every pod's report every few seconds.
        self.preemptions: collections.deque[Preemption] = collections.deque(maxlen=PREEMPTIONS_KEPT)

    @property
    def memory_budget(self) -> int:
        return self.table.memory_budget

    @property
    def max_models(self) -> int | None:
        return self.table.max_models

    @property
    def max_queue(self) -> int:
        return self.queue.max_requests

    # ----- queries -------------------------------------------------------

    def is_pinned(self, model_id: str) -> bool:
        if model_id in self._pinned:
            return True
        try:
            return self.store.get(model_id).pinned
        except errors.ModelNotFound:
            return False

    def pinned_ids(self) -> list[str]:
        return sorted(self._pinned | {spec.id for spec in self.store.list() if spec.pinned})

    def loaded_ids(self) -> list[str]:
        return sorted(key for key, copy in self.table.copies.items() if copy.state is CopyState.READY)

    def is_loaded(self, model_id: str) -> bool:
        return self.table.ready(model_id) is not None

    def loaded_worker(self, model_id: str) -> FrameworkWorker | None:
        """The worker of a READY copy, without loading or counting a request."""
        copy = self.table.ready(model_id)
        return copy.worker if copy is not None else None

    def used_bytes(self) -> int:
        """Bytes held now, including copies still loading (their estimate) or being unloaded."""
        return self.table.used_bytes()

    def held_sources(self) -> list[tuple[str, str]]:
        """(model id, source key) of every copy that holds or is loading files: the source
        fetcher keeps their cache entries leased (never evicted). Called from other threads: it
        reads a snapshot of the table."""
        from hotset_worker.sources.fetcher import source_key

        copies = [*list(self.table.copies.values()), *list(self.table.leaving)]
        copies += [copy.replacement for copy in copies if copy.replacement is not None]
        return [(copy.spec.id, source_key(copy.spec)) for copy in copies]

    def committed_bytes(self) -> int:
        """Bytes that count towards the budget: every copy but ready ones promised to a load."""
        return self.table.committed_bytes()

    def known_size(self, spec: ModelSpec) -> int:
        return self.table.known_size(spec)

    def queued_requests(self) -> int:
        """Requests waiting in the admission queue now."""
        return self.queue.requests

    def waiting(self) -> list[tuple[str, int, float]]:
        """(model, requests, seconds its first request has waited) for each model in the admission
        queue, in arrival order: demand that found no room here (the operator's pool autoscaler reads it)."""
        return self.queue.waiting(self.clock.now()) if self.queue else []

    def failures(self) -> dict[str, str]:
        """Reason of the last failed load per model that is neither loaded nor loading again now."""
        return {key: f.error.message for key, f in self.table.failures.items() if key not in self.table.copies}

    def failed_loads(self) -> list[FailedLoadView]:
        """The remembered failures (as `failures()`), with how long ago each happened."""
        now = self.clock.now()
        return [view for key in sorted(self.table.failures) if (view := self.failed_load(key, now)) is not None]

    def failed_load(self, model_id: str, now: float | None = None) -> FailedLoadView | None:
        """`model_id`'s remembered failure, unless it is loaded or loading again now."""
        failure = self.table.failures.get(model_id)
        if failure is None or model_id in self.table.copies:
            return None
        now = self.clock.now() if now is None else now
        return FailedLoadView(model_id, failure.error.message, max(0.0, now - failure.at), self.is_pinned(model_id),
                              "WarmupFailed" if isinstance(failure.error, errors.WarmupFailed) else "LoadFailed")

    def snapshot(self) -> list[CopyView]:
        now = self.clock.now()
        return sorted((self._view(key, copy, now) for key, copy in self.table.copies.items()),
                      key=lambda view: view.model_id)

    def view(self, model_id: str) -> CopyView | None:
        """One copy's snapshot (None: no copy), for a report of what changed (status_report.py)."""
        copy = self.table.copies.get(model_id)
        return self._view(model_id, copy, self.clock.now()) if copy is not None else None

    @property
    def changes(self) -> ChangeFeed:
        """The models whose copy or failure changed since /status last looked (the table's feed)."""
        return self.table.feed

    def now(self) -> float:
        """The manager's clock: the times in its views are relative to it (reports age them with it)."""
        return self.clock.now()

    @property
    def demand_half_life_s(self) -> float:
        """The half-life of each model's decayed request count (CopyView.frequency)."""
        return self.table.half_life_s

    def load_progress(self, model_id: str) -> str:
        """How far a LOADING copy's download has come (the fetcher's words; "" when none)."""
        fetcher = self.context.fetcher
        copy = self.table.copies.get(model_id)
        if fetcher is None or copy is None or copy.state is not CopyState.LOADING:
            return ""
        return fetcher.progress(model_id)

    def loading_ids(self) -> list[str]:
        return self.table.loading_ids()

    def _view(self, key: str, copy: Copy, now: float) -> CopyView:
        stats = self.table.stats.get(key)
        ticket = self.queue.get(key)
        return CopyView(
            model_id=key, framework=copy.spec.framework.value, state=copy.state, bytes=copy.bytes,
            pinned=self.is_pinned(key), inflight=copy.inflight,
            last_used_s=max(0.0, now - copy.last_used) if copy.last_used else 0.0,
            loaded_at_s=max(0.0, now - copy.loaded_at) if copy.loaded_at else 0.0,
            load_seconds=self.table.load_cost(key), frequency=stats.demand.value(now) if stats else 0.0,
            queued=copy.queued + (ticket.waiters if ticket else 0), version=copy.spec.version,
            reason=copy.rollout_error, priority=copy.spec.priority,
        )

    def deadline(self, timeout_s: float | None) -> float:
        """A request's deadline on the manager's clock: `timeout_s` from now (default: the request timeout)."""
        return self.clock.now() + (self.request_timeout_s if timeout_s is None else timeout_s)

    # ----- the request path ----------------------------------------------

    @contextlib.asynccontextmanager
    async def use(self, model_id: str, timeout_s: float | None = None,
                  timing: RequestTiming | None = None, deadline: float | None = None) -> AsyncIterator[FrameworkWorker]:
        """Get-or-load `model_id` within `timeout_s` (default: the request timeout) or by `deadline`
        (the clock's reading), and hold it (counted in flight) for the block."""
        copy = self.table.ready(model_id)
        if copy is not None and copy.worker is not None and copy.worker.lost():
            # Its engine died since the last look (Backends.keep_in_sync notices within a second):
            # this request waits for a new copy instead of failing against the dead one.
            self._drop_lost(copy)
            copy = None
        if copy is not None and not self._needs_care(copy):
            self.table.stats_of(model_id).demand.add(self.clock.now())  # the warm path: nothing to wait for
            self.table.hold(copy, self.clock.now())
            if timing is not None:
                timing.version = copy.spec.version
        else:
            copy = await self._acquire(model_id, hold=True, deadline=deadline if deadline is not None
                                       else self.deadline(timeout_s), timing=timing)
        try:
            assert copy.worker is not None
            yield copy.worker
        finally:
            if self.table.release(copy):
                self._drop_if_served(copy)

    def _needs_care(self, copy: Copy) -> bool:
        """A READY copy a request may not simply take: its spec changed (a rollout may start), or
        the store no longer lists it."""
        try:
            return rollouts.is_stale(copy, self.store.get(copy.model_id))
        except errors.ModelNotFound:
            return True

    async def load(self, model_id: str, timeout_s: float | None = None) -> None:
        """Make sure `model_id` is loaded (explicit load, pinned models), waiting for room like a request."""
        await self._acquire(model_id, hold=False, deadline=self.deadline(timeout_s), timing=None)

    async def unload(self, model_id: str) -> bool:
        """Unload `model_id` once its requests finished; False when it was not loaded.

        A loaded model that has left the store (its ServedModel was deleted) can still be unloaded."""
        if model_id not in self.table.copies:
            self.store.get(model_id)  # 404 for an unknown id
        if self.is_pinned(model_id):
            raise errors.Conflict(f"model {model_id!r} is pinned on this worker and cannot be unloaded")
        while True:
            copy = self.table.get(model_id)
            if copy is None:
                self.table.forget_failure(model_id)
                return False
            if copy.state is CopyState.READY:
                self._begin_unload(copy, evicted=False)
            waiter = copy.loading if copy.state is CopyState.LOADING else copy.gone
            assert waiter is not None
            with contextlib.suppress(errors.HotsetError):
                await asyncio.shield(waiter)
            if copy.state is CopyState.UNLOADING:
                return True

    async def _acquire(self, model_id: str, hold: bool, deadline: float, timing: RequestTiming | None) -> Copy:
        spec = self.store.get(model_id)
        timing = timing or RequestTiming()
        if hold:
            self.table.stats_of(spec.id).demand.add(self.clock.now())
        counted = False  # whether this request is already counted in the copy's `queued`
        while True:
            copy = self.table.get(model_id)
            if copy is None:
                self._raise_if_backing_off(model_id)
                # Fair order: while others wait for room, a newcomer queues behind them.
                copy = None if self.queue else self._start_load_if_room(spec)
                if copy is not None:
                    self.queue.charge(spec.namespace)
                if copy is None:
                    copy = await self._wait_in_queue(spec, deadline, timing)
                    counted = True
            if not hold:
                copy.kept = True  # an explicit load wants the copy to stay, whatever it displaces
            if copy.state is CopyState.READY:
                self._roll_if_stale(copy, spec)
                timing.version = copy.spec.version
                if hold:
                    self.table.hold(copy, self.clock.now())
                else:
                    copy.last_used = self.clock.now()
                if counted:
                    self._stop_waiting(copy)  # in flight first, so it is never an idle victim in between
                return copy
            if copy.state is CopyState.LOADING:
                if not counted:
                    copy.queued += 1
                counted = False
                started = self.clock.now()
                try:
                    await self._until(copy.loading, deadline, spec, "its load to finish")
                except BaseException:
                    self._stop_waiting(copy)
                    raise
                finally:
                    timing.load_s += self.clock.now() - started
                # READY now: the next pass counts it in flight in the same step that stops its waiting.
                counted = True
                continue
            # UNLOADING (explicitly unloaded meanwhile): wait until it is gone, then load it again.
            if counted:
                copy.queued -= 1
                counted = False
            assert copy.gone is not None
            await self._until(copy.gone, deadline, spec, "its unload to finish")

    def _stop_waiting(self, copy: Copy) -> None:
        copy.queued -= 1
        if copy.queued == 0:
            self._drop_if_served(copy)
            self._admit_queued()  # a copy nobody waits for may now be a victim

    def _drop_if_served(self, copy: Copy) -> None:
        """A transient copy leaves once the requests that wanted it are served."""
        if copy.transient and copy.state is CopyState.READY and copy.inflight == 0 and copy.queued == 0 \
                and self.queue.get(copy.model_id) is None:
            log.info("unloading %s: it served its requests and is worth less than what it would displace", copy.model_id)
            self._begin_unload(copy, evicted=True)
            self._admit_queued()

    async def _until(self, future: asyncio.Future, deadline: float, spec: ModelSpec, what: str) -> None:
        try:
            await wait_until(self.clock, future, deadline)
        except TimeoutError:
            raise errors.NoCapacity(
                f"model {spec.id!r}: the request's deadline passed while waiting for {what}",
                retry_after_s=self._retry_after(spec),
            ) from None

    # ----- the admission queue ---------------------------------------------

    async def _wait_in_queue(self, spec: ModelSpec, deadline: float, timing: RequestTiming) -> Copy:
        """Wait for room for `spec` (in the queue's order: admission.py); the copy whose load was started for it.

        The request is counted in the returned copy's `queued` (handed over with the admission)."""
        self._raise_if_it_can_never_fit(spec)
        if self.queue.is_full():
            self._observer.queue_left(spec, 0.0, "queue_full")
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} now and the admission queue is full "
                f"({self.queue.requests} requests wait for room); {self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            )
        over_share = self.queue.over_share(spec)
        if over_share:
            self._observer.queue_left(spec, 0.0, "namespace_share")
            raise errors.NoCapacity(f"no room for model {spec.id!r} now, and {over_share}; retry shortly",
                                    retry_after_s=self._retry_after(spec))
        started = self.clock.now()
        remaining = deadline - started
        expected = self.table.stats_of(spec.id).load_seconds or 0.0
        if remaining < expected:
            self._observer.queue_left(spec, 0.0, "deadline")
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} now, and its deadline cannot be met: its load takes about "
                f"{expected:.1f}s and {max(remaining, 0):.1f}s are left; {self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            )
        ticket = self.queue.join(spec, started)
        self._admit_queued()  # it may be first in line with room to spare
        self._observer.queue_length(spec, ticket.waiters)
        outcome = "admitted"
        try:
            return await wait_until(self.clock, ticket.admitted, deadline)
        except TimeoutError:
            outcome = "deadline"
            raise errors.NoCapacity(
                f"no room for model {spec.id!r}: the request's deadline passed after {self.clock.now() - started:.1f}s "
                f"in the admission queue ({self.queue.requests - 1} others wait){self._outranked_by(spec)}; "
                f"{self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            ) from None
        except errors.HotsetError:
            outcome = "failed"
            raise
        except BaseException:
            outcome = "cancelled"
            raise
        finally:
            waited = self.clock.now() - started
            timing.queue_s += waited
            self.queue.leave(ticket)
            self._observer.queue_length(spec, ticket.waiters)
            self._observer.queue_left(spec, waited, outcome)
            if outcome != "admitted" and ticket.admitted.done() and not ticket.admitted.exception():
                self._stop_waiting(ticket.admitted.result())  # admitted at the last moment, but gone

    def _admit_queued(self) -> None:
        """Start the loads that fit now, in the queue's order; the first that does not fit keeps its place."""
        while (ticket := self.queue.head()) is not None:
            copy = self.table.get(ticket.spec.id)
            if copy is None:
                try:
                    self._raise_if_backing_off(ticket.spec.id)
                    copy = self._start_load_if_room(ticket.spec)
                except errors.HotsetError as exc:
                    self.queue.refuse(ticket, exc)
                    continue
                if copy is None:
                    return
            elif copy.state is CopyState.UNLOADING:
                return  # loads again once the unload is done (which calls this again)
            self.queue.admit(ticket, copy)

    def _raise_if_it_can_never_fit(self, spec: ModelSpec) -> None:
        """Waiting helps only if evictable copies could ever make room; pinned ones never will."""
        pinned = self.table.pinned_copies()
        size = self.known_size(spec)
        no_bytes = sum(c.bytes for c in pinned) + size > self.memory_budget
        no_slot = self.max_models is not None and len(pinned) >= self.max_models
        if no_bytes or no_slot:
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} ({format_bytes(size)}) beside the pinned "
                f"models within the memory budget of {format_bytes(self.memory_budget)}"
                + (f" and the limit of {self.max_models} models" if self.max_models else "")
                + f"; {self._occupancy()}"
            )

    def _retry_after(self, spec: ModelSpec) -> int:
        """Seconds a refused client should wait: about one load of this model, at least one."""
        return max(1, math.ceil(self.table.load_cost(spec.id) or 1.0))

    def _outranked_by(self, spec: ModelSpec) -> str:
        """What a refusal says when copies of higher priority hold room `spec` may not take."""
        higher = self.table.higher_priority(spec.priority)
        if not higher:
            return ""
        return (f"; its priority {spec.priority} may not evict the copies of higher priority here "
                f"({', '.join(higher[:3])}{', ...' if len(higher) > 3 else ''})")

    def _occupancy(self) -> str:
        loading = self.table.loading_ids()
        pinned = sorted(k for k in self.table.copies if self.is_pinned(k))
        return f"loading: {', '.join(loading) or 'none'}; pinned: {', '.join(pinned) or 'none'}"

    def _raise_if_backing_off(self, model_id: str) -> None:
        """Within the back-off window after a failed load, answer its error again instead of loading."""
        found = self.table.backing_off(model_id, self.failure_backoff_s)
        if found is None:
            return
        failure, remaining = found
        again = copying.copy(failure.error)
        again.message = f"{failure.error.message} (not retried for another {remaining:.1f}s)"
        again.args = (again.message,)
        again.headers = {**failure.error.headers, "Retry-After": str(max(1, math.ceil(remaining)))}
        raise again.with_traceback(None)

    # ----- rollouts (rollouts.py decides; the manager runs them) -------------

    def roll_stale_copies(self) -> list[str]:
        """Start a rollout for every ready copy whose spec changed in a way that alters what is
        loaded (``ModelSpec.load_key``), and unload idle copies of models that left the store; the
        ids whose rollout started. Also done on each request (rollouts only)."""
        started = []
        for key, copy in list(self.table.copies.items()):
            try:
                spec = self.store.get(key)
            except errors.ModelNotFound:
                self._retire(copy)
                continue
            if self._roll_if_stale(copy, spec):
                started.append(key)
        return started

    def _retire(self, copy: Copy) -> None:
        """A copy whose model left the store (a canary that ended, a deleted ServedModel) can never
        be loaded again: unload it once it is idle instead of waiting for an eviction."""
        if copy.state is CopyState.READY and copy.inflight == 0 and copy.queued == 0 and not self.is_pinned(copy.model_id):
            log.info("unloading %s: it left the model store", copy.model_id)
            self._begin_unload(copy, evicted=False)

    def _roll_if_stale(self, copy: Copy, spec: ModelSpec) -> bool:
        """If `copy` holds other weights than `spec` declares, load `spec` beside it; it keeps serving
        until the new copy is loaded and warmed up, then the new copy takes over (a rollout)."""
        if not rollouts.should_roll(self.table, copy, spec, self.failure_backoff_s, self.clock.now()):
            self._rollouts_waiting.discard(spec.id)
            return False
        room = rollouts.room_for(self.table, copy, spec)
        if room.refusal and copy.rollout_error != room.refusal:
            copy.rollout_error = room.refusal
            log.warning("%s", room.refusal)
        for victim in room.evict_first:
            self._begin_unload(self.table.copies[victim.model_id], evicted=True, by=spec)
        if not room.fits_now:
            self._rollouts_waiting.add(spec.id)
            return False  # tried again once an unload is done, on the next request, or the next check
        self._rollouts_waiting.discard(spec.id)
        copy.rollout_error = ""
        new = self.table.start_rollout(copy, spec, room.estimate, asyncio.get_running_loop().create_future())
        self._observer.copy_added(spec)
        log.info("rolling %s from version %s to %s", spec.id, copy.spec.version, spec.version)
        self._spawn(self._run_load(new))
        return True

    def _roll_waiting_rollouts(self) -> None:
        """Memory was freed: start the rollouts that waited for room beside their old copy."""
        for key in list(self._rollouts_waiting):
            copy = self.table.ready(key)
            try:
                spec = self.store.get(key)
            except errors.ModelNotFound:
                copy = None
            if copy is None:
                self._rollouts_waiting.discard(key)
            else:
                self._roll_if_stale(copy, spec)

    # ----- loading -------------------------------------------------------

    def _start_load_if_room(self, spec: ModelSpec) -> Copy | None:
        """Start loading `spec` if room can be promised now (victims reserved); None if not yet."""
        estimate = self.known_size(spec)
        if estimate > self.memory_budget:
            raise errors.ModelTooLarge(
                f"model {spec.id!r} needs about {format_bytes(estimate)}, more than this worker's whole "
                f"memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        forced = self._other_class_victims(spec)
        if forced is None:
            return None
        victims = self.table.victims(extra_bytes=estimate, extra_slots=1, exclude=None, count_unloading=True,
                                     forced=forced, priority=spec.priority)
        if victims is None:
            return None
        copy = self.table.start_load(spec, estimate, victims, asyncio.get_running_loop().create_future())
        self._observer.copy_added(spec)
        self._spawn(self._run_load(copy))
        self._observer.memory_used(self.used_bytes())
        return copy

    def _other_class_victims(self, spec: ModelSpec) -> list[Candidate] | None:
        """The copies that must leave before `spec` loads because their latency class may not share
        a pod with its (``LatencyClass``): [] when none, None when one may not leave yet (loading,
        or requests wait for it: they are served first); refused when one is pinned here."""
        conflicts = self.table.class_conflicts(spec)
        if not conflicts:
            return []
        pinned = sorted(c.model_id for c in conflicts if self.is_pinned(c.model_id))
        if pinned:
            excluded = spec.latency_class.excludes()
            raise errors.NoCapacity(
                f"model {spec.id!r} is {spec.latency_class.value}: it never shares a worker pod with "
                f"{excluded.value if excluded else ''} models, and this pod holds the pinned "
                f"{excluded.value if excluded else ''} model(s) {', '.join(pinned[:3])}; it is served on another pod"
            )
        return self.table.evictable_now(conflicts)

    async def _run_load(self, copy: Copy) -> None:
        spec = copy.spec
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            if self._preflight is not None:
                await self._preflight(spec)
            if self.budget_mode is BudgetMode.HARD:
                modules = len(sys.modules)
                created = await loop.run_in_executor(self._load_pool, self._prepare, spec)
                await self._make_room_first(copy)
                worker, measured = await loop.run_in_executor(self._load_pool, self._load_created, created)
                imported = len(sys.modules) != modules
            else:
                # One hop to the load thread: creating the worker may import its framework (seconds for torch).
                worker, measured, imported = await loop.run_in_executor(self._load_pool, self._create_and_load, spec)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the waiters
            error = _as_load_error(spec, exc)
            if isinstance(exc, _HalfLoaded):
                await self._discard(exc.worker)
            self._fail_load(copy, error, time.perf_counter() - started)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        seconds = time.perf_counter() - started
        refusal = self._admit_loaded(copy, worker, measured, None if imported else seconds)
        if refusal is not None:
            await self._discard(worker)
            self._fail_load(copy, refusal, seconds)
            return
        self._observer.load_finished(spec, seconds, ok=True)
        self._observer.model_bytes(spec, copy.bytes)
        self._observer.memory_used(self.used_bytes())
        log.info("loaded %s (%s) in %.3fs%s", spec.id, format_bytes(copy.bytes), seconds,
                 " (transient: worth less than what it would displace)" if copy.transient else "")
        copy.loading.set_result(None)
        self._drop_if_served(copy)  # a transient copy nobody waits for any more
        self._admit_queued()

    def _create_and_load(self, spec: ModelSpec) -> tuple[FrameworkWorker, int, bool]:
        """The loaded and warmed-up worker, its measured size, and whether the load imported code
        (the first model of a framework or architecture pays for imports once: not its own cost)."""
        modules = len(sys.modules)
        worker, measured = self._load_created(self._create_worker(spec, self.context))
        return worker, measured, len(sys.modules) != modules

    def _prepare(self, spec: ModelSpec) -> FrameworkWorker:
        """What a load does before it allocates the model (a hard budget evicts only after this):
        its files fetched or found, its framework imported and its worker created (a Triton
        worker checks its folder against the trust policy then)."""
        sources.folder(spec, self.context)
        return self._create_worker(spec, self.context)

    def _load_created(self, worker: FrameworkWorker) -> tuple[FrameworkWorker, int]:
        """The created worker loaded and warmed up, and the size it counts: its measured bytes plus,
        on a GPU, the activation peak of its warm-up (weights alone would leave that out)."""
        try:
            worker.load()
            with memory.ActivationPeak() as activations:
                self._warm_up(worker)
            return worker, worker.measured_bytes() + activations.bytes
        except BaseException as exc:
            raise _HalfLoaded(worker, exc) from exc

    async def _make_room_first(self, copy: Copy) -> None:
        """Hard budget: unload this load's victims (promised to it at admission) and wait until
        everything held, its own estimate included, fits the budget; only then may it allocate."""
        give_up = self.clock.now() + ROOM_WAIT_S
        while (over := self.table.held_bytes(unloading=True) - self.memory_budget) > 0:
            leaving = over - (self.table.held_bytes(unloading=False) - self.memory_budget)
            for victim in list(self.table.copies.values()):
                if victim.promised_to == copy.model_id and victim.state is CopyState.READY:
                    leaving += victim.bytes
                    self._begin_unload(victim, evicted=True, by=copy.spec)
            if over > leaving:  # a load admitted beside it failed meanwhile, and its victims count again
                for extra in self.table.evictable(over - leaving, exclude=copy.model_id,
                                                  priority=copy.spec.priority) or []:
                    self._begin_unload(self.table.copies[extra.model_id], evicted=True, by=copy.spec)
            if self.clock.now() >= give_up:
                raise errors.NoCapacity(
                    f"model {copy.model_id!r}: no room for its {format_bytes(copy.bytes)} could be made within the "
                    f"memory budget of {format_bytes(self.memory_budget)} in {ROOM_WAIT_S:.0f}s; {self._occupancy()}"
                )
            freed = asyncio.get_running_loop().create_future()
            self._freed.append(freed)
            with contextlib.suppress(TimeoutError):
                await wait_until(self.clock, freed, min(give_up, self.clock.now() + 1.0))

    def _memory_given_back(self) -> None:
        """Wake the loads waiting for room (an unload finished, or a load failed)."""
        waiting, self._freed = self._freed, []
        for freed in waiting:
            if not freed.done():
                freed.set_result(None)

    def _warm_up(self, worker: FrameworkWorker) -> None:
        """Run the spec's warm-up inputs through the new copy while it is still LOADING, so no
        request reaches it before they ran (first-call costs: kernels, caches, lazy buffers)."""
        spec = worker.spec
        if not spec.warmup:
            return
        started = time.perf_counter()
        for index, sample in enumerate(spec.warmup):
            try:
                worker.warm_up(sample)
            except Exception as exc:  # noqa: BLE001 - any failure means the copy is not fit to serve
                cause = exc.message if isinstance(exc, errors.HotsetError) else f"{type(exc).__name__}: {exc}"
                raise errors.WarmupFailed(
                    f"warm-up of model {spec.id!r} failed on input {index} of {len(spec.warmup)}: {cause}"
                ) from exc
        self._observer.warmup_finished(spec, time.perf_counter() - started)

    def _admit_loaded(self, copy: Copy, worker: FrameworkWorker, measured: int,
                      seconds: float | None) -> errors.HotsetError | None:
        """Make the loaded copy READY and evict what no longer fits; or say why it cannot stay.
        `seconds`: the load's duration, None when it imported code (no measure of the model)."""
        spec = copy.spec
        size = measured if measured > 0 else copy.bytes
        self.table.record_load(copy, size, seconds)
        if size > self.memory_budget:
            return errors.ModelTooLarge(
                f"model {spec.id!r} measured {format_bytes(size)} after loading, more than this worker's "
                f"whole memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        declared, weights = spec.memory_bytes, worker.measured_bytes()
        if declared and weights > declared and worker.measures_its_own_bytes():
            return errors.MemoryUnderstated(
                f"model {spec.id!r} measured {format_bytes(weights)} after loading, more than the "
                f"{format_bytes(declared)} its spec declares (memory); admission counts the declaration, so "
                f"declare at least {format_bytes(weights)}; nothing was evicted"
            )
        self.table.release_promises(spec.id)  # chosen again below, with the measured size
        if copy.replaces is not None:
            copy.replaces.promised_to = spec.id  # a rollout's old copy stays out of the count: it is leaving
        # Copies still unloading were already given up for loads admitted before this one: their
        # memory is that earlier room, so only what is not leaving counts here.
        victims = self.table.victims(extra_bytes=0, extra_slots=0, exclude=spec.id, count_unloading=False,
                                     priority=spec.priority)
        if victims is None:
            if copy.replaces is not None:
                self.table.cancel_rollout(copy.replaces)
            return errors.NoCapacity(
                f"model {spec.id!r} measured {format_bytes(size)} after loading, and no room for it can be "
                f"made within the memory budget of {format_bytes(self.memory_budget)}; {self._occupancy()}"
            )
        old = copy.replaces
        now = self.clock.now()
        self.table.finish_load(copy, worker, now)
        if old is not None:
            if old.state is CopyState.READY:
                self._begin_unload(old, evicted=False)
            log.info("rolled %s to version %s", spec.id, spec.version)
        if victims and self._worth_less_than(copy, victims, now):
            copy.transient = True  # serve what waits for it, keep the more valuable copies...
            # ...but what is over the budget even without it (a load admitted meanwhile) still goes.
            victims = self.table.victims(extra_bytes=0, extra_slots=0, exclude=spec.id, count_unloading=False,
                                         count_excluded=False, priority=spec.priority) or []
        for victim in victims:
            self._begin_unload(self.table.copies[victim.model_id], evicted=True, by=spec)
        for other in self.table.class_conflicts(spec):  # promised to this load at its start: they go now
            if other.state is CopyState.READY and not self.is_pinned(other.model_id):
                log.info("evicting %s: a %s model never shares a pod with the %s model %s", other.model_id,
                         other.spec.latency_class.value, spec.latency_class.value, spec.id)
                self._begin_unload(other, evicted=True)
        return None

    def _worth_less_than(self, copy: Copy, victims: list[Candidate], now: float) -> bool:
        """Admission control: would keeping `copy` cost more reloads than it saves? Its expected
        reload seconds (demand x load seconds) against those of the copies it would displace; an
        explicit load always stays."""
        if not self.admission_control or copy.kept or self.is_pinned(copy.model_id):
            return False
        return eviction_cost([self.table.candidate(copy, now)]) < eviction_cost(victims)

    def _fail_load(self, copy: Copy, error: errors.HotsetError, seconds: float) -> None:
        self.table.fail_load(copy, error, self.clock.now())
        self._memory_given_back()
        self._observer.copy_gone(copy.spec)
        log.warning("load of %s failed: %s", copy.model_id, error.message)
        self._observer.load_finished(copy.spec, seconds, ok=False)
        self._observer.memory_used(self.used_bytes())
        copy.loading.set_exception(error)
        copy.loading.add_done_callback(lambda future: future.exception())  # retrieved, even with no waiter
        self._admit_queued()

    async def _discard(self, worker: FrameworkWorker) -> None:
        """Unload a worker that will not be kept (failed half-way or refused after measuring)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._load_pool, worker.unload)
        except Exception:  # noqa: BLE001 - the load error is what the caller must see
            log.exception("unloading discarded %s failed", worker.spec.id)

    # ----- unloading -------------------------------------------------------

    def _begin_unload(self, copy: Copy, evicted: bool, by: ModelSpec | None = None) -> None:
        """`copy` starts leaving; `evicted`: to make room, for `by`'s load when one wanted it (the
        log names the preempting model when priorities decided)."""
        self.table.start_unload(copy, asyncio.get_running_loop().create_future())
        if evicted:
            if by is not None and by.priority > copy.spec.priority:
                log.info("evicting %s (%s, priority %d): preempted by the load of %s (priority %d)", copy.model_id,
                         format_bytes(copy.bytes), copy.spec.priority, by.id, by.priority)
                seq = self.preemptions[-1].seq + 1 if self.preemptions else 1
                self.preemptions.append(Preemption(seq=seq, model=copy.model_id, priority=copy.spec.priority,
                                                   by=by.id, by_priority=by.priority, at=time.time()))
            else:
                log.info("evicting %s (%s)", copy.model_id, format_bytes(copy.bytes))
            self._observer.model_evicted(copy.spec)
        self._spawn(self._finish_unload(copy))

    async def _finish_unload(self, copy: Copy) -> None:
        await copy.drained.wait()  # never unload under a request
        assert copy.worker is not None and copy.gone is not None
        try:
            await asyncio.get_running_loop().run_in_executor(self._load_pool, copy.worker.unload)
        except Exception:  # noqa: BLE001 - the copy is gone either way
            log.exception("unload of %s raised; dropping it anyway", copy.model_id)
        self.table.finish_unload(copy)
        self._memory_given_back()
        self._roll_waiting_rollouts()
        if copy.model_id not in self.table.copies:  # a rollout's new copy keeps its series
            self._observer.model_bytes(copy.spec, None)
        self._observer.copy_gone(copy.spec)
        self._observer.memory_used(self.used_bytes())
        copy.gone.set_result(None)
        self._admit_queued()

    # ----- a backend that lost its models ----------------------------------

    async def forget_lost_copies(self, framework: Framework, held_now: HeldModels) -> list[str]:
        """Drop READY copies of `framework` that their backend no longer holds; the ids dropped.

        A Triton sidecar that restarted comes back empty while the table still
        says READY. `held_now` asks the backend what it holds (None: it did not
        answer, so nothing is concluded). Only copies loaded before the question
        was asked can be missing from its answer. A dropped copy goes the way of
        an unload (its requests finish, its bytes stop counting, the next
        request or the pinned loader loads it again).
        """
        copies = self.table.copies
        if not any(c.state is CopyState.READY and c.spec.framework is framework for c in copies.values()):
            return []
        asked_at = self.clock.now()
        held = await held_now()
        if held is None:
            return []
        lost = [
            copy for key, copy in copies.items()
            if copy.state is CopyState.READY and copy.spec.framework is framework
            and copy.loaded_at <= asked_at and key not in held
        ]
        for copy in lost:
            self._drop_lost(copy)
        return sorted(copy.model_id for copy in lost)

    def _drop_lost(self, copy: Copy) -> None:
        """A READY copy whose backend lost it goes the way of an unload; the next request loads it again."""
        log.warning("%s no longer holds %s (restarted?); dropping it so it loads again",
                    copy.spec.framework.value, copy.model_id)
        self._begin_unload(copy, evicted=False)
        self._observer.memory_used(self.used_bytes())

    # ----- lifecycle -----------------------------------------------------

    async def load_pinned(self) -> bool:
        """Load every pinned model not loaded yet; True when all of them are loaded."""
        missing = [key for key in self.pinned_ids() if not self.is_loaded(key)]
        results = [await _attempt(self.load(key)) for key in missing]
        return all(results)

    async def keep_pinned_loaded(self, check_s: float = 5.0, max_retry_s: float = 60.0) -> None:
        """Forever: roll copies whose spec changed, load pinned models (also ones the store gains
        later); back off while pinned loads fail."""
        delay = check_s
        while True:
            self.roll_stale_copies()  # a spec changed in the store: its copies roll without waiting for traffic
            delay = check_s if await self.load_pinned() else min(delay * 2, max_retry_s)
            await asyncio.sleep(delay)

    async def settled(self) -> None:
        """Wait until no load or unload is in progress (tests, graceful shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Unload everything and stop the load threads (server shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.queue.close(errors.BackendUnavailable("the worker is shutting down"))
        loop = asyncio.get_running_loop()
        for copy in list(self.table.all_copies()):
            if copy.worker is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._load_pool, copy.worker.unload)
        self.table.clear()
        self._load_pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _HalfLoaded(Exception):
    """A load that failed after its worker was created: the worker must still be unloaded."""

    def __init__(self, worker: FrameworkWorker, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.worker = worker
        self.cause = cause


async def _attempt(awaitable: Awaitable[None]) -> bool:
    try:
        await awaitable
    except errors.HotsetError as exc:
        log.warning("pinned model not loaded: %s", exc.message)
        return False
    return True


def _as_load_error(spec: ModelSpec, exc: BaseException) -> errors.HotsetError:
    """Every load failure as a HotsetError whose message names the model and the cause."""
    if isinstance(exc, _HalfLoaded):
        exc = exc.cause
    prefix = f"loading model {spec.id!r} failed: "
    if isinstance(exc, asyncio.CancelledError):
        return errors.ModelLoadFailed(prefix + "cancelled (the worker is shutting down)")
    if isinstance(exc, errors.HotsetError) and not isinstance(exc, errors.BadInput):
        if repr(spec.id) not in exc.message:
            exc.message = prefix + exc.message
            exc.args = (exc.message,)
        return exc
    cause = exc.message if isinstance(exc, errors.HotsetError) else f"{type(exc).__name__}: {exc}"
    return errors.ModelLoadFailed(prefix + cause)
