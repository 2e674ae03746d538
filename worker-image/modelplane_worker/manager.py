"""ModelManager: the only holder of "what is in memory" in a worker pod.

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
  (``modelplane_common.eviction``: reload seconds saved per byte, churn
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
  measured size exceeds the budget is unloaded again and refused.
- **Spec changes are rollouts.** A READY copy whose spec changed in what
  decides its weights (``ModelSpec.load_key``: framework, task, source,
  version) keeps serving while the new version loads and warms up beside it
  (its room is the old copy's), then the new copy takes over and the old one
  drains and unloads. Every answer names the version of the copy that
  computed it. A failed rollout leaves the old copy serving, with the reason.
- **Warm-up before ready.** A spec's ``warmup`` inputs run through a new copy
  while it is still LOADING (on the load thread); a failing one fails the load
  (``WarmupFailed``: nothing evicted) and no request reaches a copy before they
  all ran.
- **Loads never block loaded models.** ``load()``/``unload()`` run on a small
  thread pool of their own; inference runs on another (``asyncio.to_thread``).
  All table changes happen on the event loop between awaits, so they need no lock.
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
import concurrent.futures
import contextlib
import copy as copying
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable, Protocol

from modelplane_common import errors
from modelplane_common.eviction import Candidate, DecayedCount, EvictionPolicy, choose_victims, eviction_cost
from modelplane_common.quantity import format_bytes
from modelplane_common.spec import Framework, ModelSpec
from modelplane_common.wire import CopyState
from modelplane_worker import engine
from modelplane_worker.frameworks.base import FrameworkWorker, WorkerContext
from modelplane_worker.store import ModelStore

log = logging.getLogger(__name__)

Preflight = Callable[[ModelSpec], Awaitable[None]]
HeldModels = Callable[[], Awaitable["set[str] | None"]]
WorkerFactory = Callable[[ModelSpec, WorkerContext], FrameworkWorker]

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_QUEUE = 256


class ManagerObserver(Protocol):
    """What the manager reports as it works (the worker's Prometheus metrics implement it)."""

    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None: ...

    def warmup_finished(self, spec: ModelSpec, seconds: float) -> None: ...

    def model_evicted(self, spec: ModelSpec) -> None: ...

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None: ...

    def memory_used(self, used: int) -> None: ...

    def queue_length(self, spec: ModelSpec, waiting: int) -> None: ...

    def queue_left(self, spec: ModelSpec, seconds: float, outcome: str) -> None: ...


class _NoObserver:
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

    queue_s: float = 0.0  # waiting for room in the admission queue
    load_s: float = 0.0  # waiting for its model's load (its own or one it joined)
    infer_s: float = 0.0  # the framework's inference
    version: str = ""  # the version of the copy that served it (during a rollout, maybe not the store's)

    def header(self) -> str:
        """``queue;dur=0.0, load;dur=41.3, infer;dur=3.2`` (milliseconds, as the header wants)."""
        return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in
                         (("queue", self.queue_s), ("load", self.load_s), ("infer", self.infer_s)))


@dataclass(eq=False)
class _Copy:
    """One model's copy in this pod; only the manager touches it."""

    spec: ModelSpec
    state: CopyState
    bytes: int
    loading: asyncio.Future[None]
    worker: FrameworkWorker | None = None
    inflight: int = 0
    queued: int = 0  # requests waiting for this copy's load to finish
    last_used: float = 0.0
    loaded_at: float = 0.0
    promised_to: str | None = None  # a READY copy reserved as the victim of this loading model
    kept: bool = False  # an explicit load (API, pinned) or a rollout asked for it: never transient
    replacement: "_Copy | None" = None  # READY: the copy of the new version loading to take over from it
    replaces: "_Copy | None" = None  # a rollout's new copy: the one it takes over from
    rollout_error: str = ""  # READY: why the last rollout from it failed (it keeps serving)
    transient: bool = False  # admitted only for the requests that wanted it: unloaded once they are served
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.drained.set()

    @property
    def counts_towards_budget(self) -> bool:
        """Every copy that holds (or is about to hold) memory, except ready ones already promised
        to a load as its victims: their bytes are that load's room."""
        return self.state is not CopyState.READY or self.promised_to is None


@dataclass
class _ModelStats:
    """What the manager remembers of a model across its loads and evictions."""

    demand: DecayedCount
    load_seconds: float | None = None  # its last successful load that imported no code; None: none yet
    measured_bytes: int = 0  # its size at that load


@dataclass(eq=False)
class _Ticket:
    """One model's place in the admission queue, shared by every request waiting for it."""

    spec: ModelSpec
    admitted: asyncio.Future[_Copy]
    waiters: int = 0
    since: float = 0.0  # event-loop time its first request joined the queue


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


@dataclass(frozen=True)
class _Failure:
    """The last failed load of one model: what every retry within the back-off window answers."""

    error: errors.ModelplaneError
    at: float  # the manager's clock
    load_key: tuple[str, ...] = ()  # the spec that failed (a rollout's failure does not hide the copy serving)

    def backs_off(self) -> bool:
        return not isinstance(self.error, errors.BackendUnavailable)


@dataclass(frozen=True)
class FailedLoadView:
    """A remembered load failure, for /status (a FAILED copy) and the repository index."""

    model_id: str
    reason: str
    failed_at_s: float  # seconds since it failed
    pinned: bool
    failure: str = "LoadFailed"  # WarmupFailed when the model loaded but its warm-up failed


class ModelManager:
    def __init__(
        self,
        store: ModelStore,
        context: WorkerContext,
        memory_budget: int,
        *,
        max_models: int | None = None,
        policy: EvictionPolicy | None = None,
        pinned: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        observer: ManagerObserver | None = None,
        preflight: Preflight | None = None,
        create_worker: WorkerFactory = engine.create,
        load_threads: int = 2,
        failure_backoff_s: float = 5.0,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_queue: int = DEFAULT_MAX_QUEUE,
        demand_half_life_s: float | None = None,
        admission_control: bool = True,
    ) -> None:
        if memory_budget <= 0:
            raise ValueError(f"memory budget must be positive, got {memory_budget}")
        if max_models is not None and max_models < 1:
            raise ValueError(f"max models must be at least 1, got {max_models}")
        if failure_backoff_s < 0:
            raise ValueError(f"failed-load back-off must not be negative, got {failure_backoff_s}")
        if request_timeout_s <= 0:
            raise ValueError(f"request timeout must be positive, got {request_timeout_s}")
        if max_queue < 0:
            raise ValueError(f"admission queue size must not be negative, got {max_queue}")
        self.store = store
        self.context = context
        self.memory_budget = memory_budget
        self.max_models = max_models
        self.policy = policy or EvictionPolicy()
        self.failure_backoff_s = failure_backoff_s
        self.request_timeout_s = request_timeout_s
        self.max_queue = max_queue
        self._half_life_s = demand_half_life_s or DecayedCount().half_life_s
        self.admission_control = admission_control
        self._pinned = frozenset(pinned)
        self._clock = clock
        self._observer = observer or _NoObserver()
        self._preflight = preflight
        self._create_worker = create_worker
        self._copies: dict[str, _Copy] = {}
        self._leaving: set[_Copy] = set()  # replaced by a rollout, unloading once drained
        self._queue: dict[str, _Ticket] = {}  # insertion order is arrival order
        self._queued_requests = 0
        self._failures: dict[str, _Failure] = {}  # last failed load per model, until a load succeeds
        self._stats: dict[str, _ModelStats] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._load_pool = concurrent.futures.ThreadPoolExecutor(load_threads, thread_name_prefix="model-load")

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
        return sorted(key for key, copy in self._copies.items() if copy.state is CopyState.READY)

    def is_loaded(self, model_id: str) -> bool:
        copy = self._copies.get(model_id)
        return copy is not None and copy.state is CopyState.READY

    def loaded_worker(self, model_id: str) -> FrameworkWorker | None:
        """The worker of a READY copy, without loading or counting a request."""
        copy = self._copies.get(model_id)
        return copy.worker if copy is not None and copy.state is CopyState.READY else None

    def _all_copies(self) -> Iterable[_Copy]:
        """Every copy that holds memory: the table's, the new copies of rollouts in progress, and
        old copies a rollout replaced that are still draining."""
        for copy in self._copies.values():
            yield copy
            if copy.replacement is not None:
                yield copy.replacement
        yield from self._leaving

    def used_bytes(self) -> int:
        """Bytes held now, including copies still loading (their estimate) or being unloaded."""
        return sum(copy.bytes for copy in self._all_copies())

    def committed_bytes(self) -> int:
        """Bytes that count towards the budget: every copy but ready ones promised to a load."""
        return sum(copy.bytes for copy in self._all_copies() if copy.counts_towards_budget)

    def known_size(self, spec: ModelSpec) -> int:
        """The best size figure for `spec`: measured at its last load, else its estimate."""
        stats = self._stats.get(spec.id)
        return stats.measured_bytes if stats is not None and stats.measured_bytes > 0 else spec.memory_bytes

    def queued_requests(self) -> int:
        """Requests waiting in the admission queue now."""
        return self._queued_requests

    def waiting(self) -> list[tuple[str, int, float]]:
        """(model, requests, seconds its first request has waited) for each model in the admission
        queue, in arrival order: demand that found no room here (the operator's pool autoscaler reads it)."""
        if not self._queue:
            return []
        now = asyncio.get_running_loop().time()
        return [(key, ticket.waiters, max(0.0, now - ticket.since)) for key, ticket in self._queue.items()]

    def failures(self) -> dict[str, str]:
        """Reason of the last failed load per model that is neither loaded nor loading again now."""
        return {key: failure.error.message for key, failure in self._failures.items() if key not in self._copies}

    def failed_loads(self) -> list[FailedLoadView]:
        """The remembered failures (as `failures()`), with how long ago each happened."""
        now = self._clock()
        return [
            FailedLoadView(key, failure.error.message, max(0.0, now - failure.at), self.is_pinned(key),
                           "WarmupFailed" if isinstance(failure.error, errors.WarmupFailed) else "LoadFailed")
            for key, failure in sorted(self._failures.items())
            if key not in self._copies
        ]

    def snapshot(self) -> list[CopyView]:
        now = self._clock()
        views = []
        for key, copy in self._copies.items():
            stats = self._stats.get(key)
            ticket = self._queue.get(key)
            views.append(CopyView(
                model_id=key,
                framework=copy.spec.framework.value,
                state=copy.state,
                bytes=copy.bytes,
                pinned=self.is_pinned(key),
                inflight=copy.inflight,
                last_used_s=max(0.0, now - copy.last_used) if copy.last_used else 0.0,
                loaded_at_s=max(0.0, now - copy.loaded_at) if copy.loaded_at else 0.0,
                load_seconds=self._load_cost(key),
                frequency=stats.demand.value(now) if stats else 0.0,
                queued=copy.queued + (ticket.waiters if ticket else 0),
                version=copy.spec.version,
                reason=copy.rollout_error,
            ))
        return sorted(views, key=lambda view: view.model_id)

    # ----- the request path ----------------------------------------------

    @contextlib.asynccontextmanager
    async def use(self, model_id: str, timeout_s: float | None = None,
                  timing: RequestTiming | None = None) -> AsyncIterator[FrameworkWorker]:
        """Get-or-load `model_id` within `timeout_s` (default: the request timeout) and hold it
        (counted in flight) for the block."""
        copy = await self._acquire(model_id, hold=True, timeout_s=timeout_s, timing=timing)
        try:
            assert copy.worker is not None
            yield copy.worker
        finally:
            copy.inflight -= 1
            if copy.inflight == 0:
                copy.drained.set()
                self._drop_if_served(copy)

    async def load(self, model_id: str, timeout_s: float | None = None) -> None:
        """Make sure `model_id` is loaded (explicit load, pinned models), waiting for room like a request."""
        await self._acquire(model_id, hold=False, timeout_s=timeout_s, timing=None)

    async def unload(self, model_id: str) -> bool:
        """Unload `model_id` once its requests finished; False when it was not loaded.

        A loaded model that has left the store (its ServedModel was deleted) can still be unloaded."""
        if model_id not in self._copies:
            self.store.get(model_id)  # 404 for an unknown id
        if self.is_pinned(model_id):
            raise errors.Conflict(f"model {model_id!r} is pinned on this worker and cannot be unloaded")
        while True:
            copy = self._copies.get(model_id)
            if copy is None:
                self._failures.pop(model_id, None)
                return False
            if copy.state is CopyState.READY:
                self._begin_unload(copy, evicted=False)
            waiter = copy.loading if copy.state is CopyState.LOADING else copy.gone
            assert waiter is not None
            with contextlib.suppress(errors.ModelplaneError):
                await asyncio.shield(waiter)
            if copy.state is CopyState.UNLOADING:
                return True

    async def _acquire(self, model_id: str, hold: bool, timeout_s: float | None,
                       timing: RequestTiming | None) -> _Copy:
        spec = self.store.get(model_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.request_timeout_s if timeout_s is None else timeout_s)
        timing = timing or RequestTiming()
        if hold:
            self._stats_of(spec.id).demand.add(self._clock())
        counted = False  # whether this request is already counted in the copy's `queued`
        while True:
            copy = self._copies.get(model_id)
            if copy is None:
                self._raise_if_backing_off(model_id)
                # Fair order: while others wait for room, a newcomer queues behind them.
                copy = None if self._queue else self._start_load_if_room(spec)
                if copy is None:
                    copy = await self._wait_in_queue(spec, deadline, timing)
                    counted = True
            if not hold:
                copy.kept = True  # an explicit load wants the copy to stay, whatever it displaces
            if copy.state is CopyState.READY:
                self._roll_if_stale(copy, spec)
                copy.last_used = self._clock()
                timing.version = copy.spec.version
                if hold:
                    copy.inflight += 1
                    copy.drained.clear()
                if counted:
                    self._stop_waiting(copy)  # in flight first, so it is never an idle victim in between
                return copy
            if copy.state is CopyState.LOADING:
                if not counted:
                    copy.queued += 1
                counted = False
                started = loop.time()
                try:
                    await self._until(copy.loading, deadline, spec, "its load to finish")
                except BaseException:
                    self._stop_waiting(copy)
                    raise
                finally:
                    timing.load_s += loop.time() - started
                # READY now: the next pass counts it in flight in the same step that stops its waiting.
                counted = True
                continue
            # UNLOADING (explicitly unloaded meanwhile): wait until it is gone, then load it again.
            if counted:
                copy.queued -= 1
                counted = False
            assert copy.gone is not None
            await self._until(copy.gone, deadline, spec, "its unload to finish")

    def _stop_waiting(self, copy: _Copy) -> None:
        copy.queued -= 1
        if copy.queued == 0:
            self._drop_if_served(copy)
            self._admit_queued()  # a copy nobody waits for may now be a victim

    def _drop_if_served(self, copy: _Copy) -> None:
        """A transient copy leaves once the requests that wanted it are served."""
        if copy.transient and copy.state is CopyState.READY and copy.inflight == 0 and copy.queued == 0 \
                and copy.spec.id not in self._queue:
            log.info("unloading %s: it served its requests and is worth less than what it would displace", copy.spec.id)
            self._begin_unload(copy, evicted=True)
            self._admit_queued()

    async def _until(self, future: asyncio.Future, deadline: float, spec: ModelSpec, what: str) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(future), max(remaining, 0.0))
        except (asyncio.TimeoutError, TimeoutError):
            raise errors.NoCapacity(
                f"model {spec.id!r}: the request's deadline passed while waiting for {what}",
                retry_after_s=self._retry_after(spec),
            ) from None

    # ----- the admission queue ---------------------------------------------

    async def _wait_in_queue(self, spec: ModelSpec, deadline: float, timing: RequestTiming) -> _Copy:
        """Wait for room for `spec`, first come first served; the copy whose load was started for it.

        The request is counted in the returned copy's `queued` (handed over with the admission)."""
        loop = asyncio.get_running_loop()
        self._raise_if_it_can_never_fit(spec)
        if self._queued_requests >= self.max_queue:
            self._observer.queue_left(spec, 0.0, "queue_full")
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} now and the admission queue is full "
                f"({self._queued_requests} requests wait for room); {self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            )
        remaining = deadline - loop.time()
        expected = self._stats_of(spec.id).load_seconds or 0.0
        if remaining < expected:
            self._observer.queue_left(spec, 0.0, "deadline")
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} now, and its deadline cannot be met: its load takes about "
                f"{expected:.1f}s and {max(remaining, 0):.1f}s are left; {self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            )
        ticket = self._queue.get(spec.id)
        if ticket is None:
            ticket = self._queue[spec.id] = _Ticket(spec, loop.create_future(), since=loop.time())
        ticket.waiters += 1
        self._queued_requests += 1
        self._admit_queued()  # it may be first in line with room to spare
        self._observer.queue_length(spec, ticket.waiters)
        started = loop.time()
        outcome = "admitted"
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.admitted), max(remaining, 0.0))
        except (asyncio.TimeoutError, TimeoutError):
            outcome = "deadline"
            raise errors.NoCapacity(
                f"no room for model {spec.id!r}: the request's deadline passed after {loop.time() - started:.1f}s "
                f"in the admission queue ({self._queued_requests - 1} others wait); {self._occupancy()}",
                retry_after_s=self._retry_after(spec),
            ) from None
        except errors.ModelplaneError:
            outcome = "failed"
            raise
        except BaseException:
            outcome = "cancelled"
            raise
        finally:
            waited = loop.time() - started
            timing.queue_s += waited
            ticket.waiters -= 1
            self._queued_requests -= 1
            self._observer.queue_length(spec, ticket.waiters)
            self._observer.queue_left(spec, waited, outcome)
            if outcome != "admitted" and ticket.admitted.done() and not ticket.admitted.exception():
                self._stop_waiting(ticket.admitted.result())  # admitted at the last moment, but gone
            if ticket.waiters == 0 and self._queue.get(spec.id) is ticket:
                del self._queue[spec.id]  # nobody waits any more: its load is not started

    def _admit_queued(self) -> None:
        """Start the loads that fit now, in arrival order; the first that does not fit keeps its place."""
        while self._queue:
            model_id, ticket = next(iter(self._queue.items()))
            copy = self._copies.get(model_id)
            if copy is None:
                try:
                    self._raise_if_backing_off(model_id)
                    copy = self._start_load_if_room(ticket.spec)
                except errors.ModelplaneError as exc:
                    del self._queue[model_id]
                    ticket.admitted.set_exception(exc)
                    ticket.admitted.add_done_callback(lambda future: future.exception())
                    continue
                if copy is None:
                    return
            elif copy.state is CopyState.UNLOADING:
                return  # loads again once the unload is done (which calls this again)
            del self._queue[model_id]
            copy.queued += ticket.waiters
            ticket.admitted.set_result(copy)

    def _raise_if_it_can_never_fit(self, spec: ModelSpec) -> None:
        """Waiting helps only if evictable copies could ever make room; pinned ones never will."""
        pinned = [c for key, c in self._copies.items() if self.is_pinned(key) and c.counts_towards_budget]
        no_bytes = sum(c.bytes for c in pinned) + self.known_size(spec) > self.memory_budget
        no_slot = self.max_models is not None and len(pinned) >= self.max_models
        if no_bytes or no_slot:
            raise errors.NoCapacity(
                f"no room for model {spec.id!r} ({format_bytes(self.known_size(spec))}) beside the pinned "
                f"models within the memory budget of {format_bytes(self.memory_budget)}"
                + (f" and the limit of {self.max_models} models" if self.max_models else "")
                    + f"; {self._occupancy()}"
            )

    def _retry_after(self, spec: ModelSpec) -> int:
        """Seconds a refused client should wait: about one load of this model, at least one."""
        return max(1, math.ceil(self._load_cost(spec.id) or 1.0))

    def _occupancy(self) -> str:
        loading = sorted(k for k, c in self._copies.items() if c.state is CopyState.LOADING)
        pinned = sorted(k for k in self._copies if self.is_pinned(k))
        return f"loading: {', '.join(loading) or 'none'}; pinned: {', '.join(pinned) or 'none'}"

    # ----- loading -------------------------------------------------------

    def _stats_of(self, model_id: str) -> _ModelStats:
        stats = self._stats.get(model_id)
        if stats is None:
            stats = self._stats[model_id] = _ModelStats(DecayedCount(self._half_life_s))
        return stats

    def _raise_if_backing_off(self, model_id: str) -> None:
        """Within the back-off window after a failed load, answer its error again instead of loading."""
        failure = self._failures.get(model_id)
        if failure is None or not failure.backs_off():
            return
        remaining = failure.at + self.failure_backoff_s - self._clock()
        if remaining <= 0:
            return
        again = copying.copy(failure.error)
        again.message = f"{failure.error.message} (not retried for another {remaining:.1f}s)"
        again.args = (again.message,)
        again.headers = {**failure.error.headers, "Retry-After": str(max(1, math.ceil(remaining)))}
        raise again.with_traceback(None)

    # ----- rollouts: a changed spec takes over from the copy it changes ------

    def roll_stale_copies(self) -> list[str]:
        """Start a rollout for every ready copy whose spec changed in a way that alters what is
        loaded (``ModelSpec.load_key``), and unload idle copies of models that left the store; the
        ids whose rollout started. Also done on each request (rollouts only)."""
        started = []
        for key, copy in list(self._copies.items()):
            try:
                spec = self.store.get(key)
            except errors.ModelNotFound:
                self._retire(copy)
                continue
            if copy.state is CopyState.READY and self._roll_if_stale(copy, spec):
                started.append(key)
        return started

    def _retire(self, copy: _Copy) -> None:
        """A copy whose model left the store (a canary that ended, a deleted ServedModel) can never
        be loaded again: unload it once it is idle instead of waiting for an eviction."""
        if copy.state is CopyState.READY and copy.inflight == 0 and copy.queued == 0 and not self.is_pinned(copy.spec.id):
            log.info("unloading %s: it left the model store", copy.spec.id)
            self._begin_unload(copy, evicted=False)

    def _roll_if_stale(self, copy: _Copy, spec: ModelSpec) -> bool:
        """If `copy` holds other weights than `spec` declares, load `spec` beside it; it keeps serving
        until the new copy is loaded and warmed up, then the new copy takes over (a rollout)."""
        if copy.replacement is not None or copy.spec.load_key() == spec.load_key():
            return False
        failure = self._failures.get(spec.id)
        if failure is not None and failure.load_key == spec.load_key() and self._clock() < failure.at + self.failure_backoff_s:
            return False  # that version just failed: the old one serves until the back-off ends
        estimate = self.known_size(spec)
        copy.promised_to = spec.id  # the old copy's room is the new one's
        victims = self._victims(extra_bytes=estimate, extra_slots=1, exclude=None, count_unloading=True)
        if victims is None or estimate > self.memory_budget:
            copy.promised_to = None
            return False  # no room beside it now: tried again on the next request or check
        for victim in victims:
            self._copies[victim.model_id].promised_to = spec.id
        new = _Copy(spec=spec, state=CopyState.LOADING, bytes=estimate, kept=True, replaces=copy,
                    loading=asyncio.get_running_loop().create_future())
        copy.replacement = new
        log.info("rolling %s from version %s to %s", spec.id, copy.spec.version, spec.version)
        self._spawn(self._run_load(new))
        return True

    def _take_over(self, new: _Copy) -> None:
        """A rollout's new copy replaces the old one in the table; the old one drains and unloads."""
        old = new.replaces
        assert old is not None
        old.replacement = None
        new.replaces = None
        if self._copies.get(new.spec.id) is old:
            if old.state is CopyState.READY:
                self._begin_unload(old, evicted=False)
            if old.state is CopyState.UNLOADING:
                self._leaving.add(old)  # still holds its memory until its requests are done
        self._copies[new.spec.id] = new
        log.info("rolled %s to version %s", new.spec.id, new.spec.version)

    def _start_load_if_room(self, spec: ModelSpec) -> _Copy | None:
        """Start loading `spec` if room can be promised now (victims reserved); None if not yet."""
        estimate = self.known_size(spec)
        if estimate > self.memory_budget:
            raise errors.ModelTooLarge(
                f"model {spec.id!r} needs about {format_bytes(estimate)}, more than this worker's whole "
                f"memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        victims = self._victims(extra_bytes=estimate, extra_slots=1, exclude=None, count_unloading=True)
        if victims is None:
            return None
        for victim in victims:
            self._copies[victim.model_id].promised_to = spec.id
        copy = _Copy(spec=spec, state=CopyState.LOADING, bytes=estimate,
                     loading=asyncio.get_running_loop().create_future())
        self._copies[spec.id] = copy
        self._spawn(self._run_load(copy))
        self._observer.memory_used(self.used_bytes())
        return copy

    async def _run_load(self, copy: _Copy) -> None:
        spec = copy.spec
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        worker: FrameworkWorker | None = None
        try:
            if self._preflight is not None:
                await self._preflight(spec)
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
        worker = self._create_worker(spec, self.context)
        try:
            worker.load()
            self._warm_up(worker)
            return worker, worker.measured_bytes(), len(sys.modules) != modules
        except BaseException as exc:
            raise _HalfLoaded(worker, exc) from exc

    def _warm_up(self, worker: FrameworkWorker) -> None:
        """Run the spec's warm-up inputs through the new copy while it is still LOADING, so no
        request reaches it before they ran (first-call costs: kernels, caches, lazy buffers)."""
        spec = worker.spec
        if not spec.warmup:
            return
        started = time.perf_counter()
        for index, sample in enumerate(spec.warmup):
            try:
                worker.predict(sample)
            except Exception as exc:  # noqa: BLE001 - any failure means the copy is not fit to serve
                cause = exc.message if isinstance(exc, errors.ModelplaneError) else f"{type(exc).__name__}: {exc}"
                raise errors.WarmupFailed(
                    f"warm-up of model {spec.id!r} failed on input {index} of {len(spec.warmup)}: {cause}"
                ) from exc
        self._observer.warmup_finished(spec, time.perf_counter() - started)

    def _load_cost(self, model_id: str) -> float:
        """A model's reload seconds for the cost model: its last clean load (one that imported no
        code). Until it has one, 0 (the cost model's floor): such a model is cheap to evict and
        is measured again at its next load, whereas a load that paid for imports would make a
        model look expensive for good (it would never be evicted to be measured again)."""
        stats = self._stats.get(model_id)
        return stats.load_seconds if stats is not None and stats.load_seconds is not None else 0.0

    def _admit_loaded(self, copy: _Copy, worker: FrameworkWorker, measured: int,
                      seconds: float | None) -> errors.ModelplaneError | None:
        """Make the loaded copy READY and evict what no longer fits; or say why it cannot stay.
        `seconds`: the load's duration, None when it imported code (no measure of the model)."""
        spec = copy.spec
        size = measured if measured > 0 else copy.bytes
        stats = self._stats_of(spec.id)
        stats.measured_bytes = size
        if seconds is not None:
            stats.load_seconds = seconds
        if size > self.memory_budget:
            return errors.ModelTooLarge(
                f"model {spec.id!r} measured {format_bytes(size)} after loading, more than this worker's "
                f"whole memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        self._release_promises(spec.id)  # chosen again below, with the measured size
        if copy.replaces is not None:
            copy.replaces.promised_to = spec.id  # a rollout's old copy stays out of the count: it is leaving
        copy.bytes = size
        # Copies still unloading were already given up for loads admitted before this one: their
        # memory is that earlier room, so only what is not leaving counts here.
        victims = self._victims(extra_bytes=0, extra_slots=0, exclude=spec.id, count_unloading=False)
        if victims is None:
            if copy.replaces is not None:
                copy.replaces.promised_to = None
            return errors.NoCapacity(
                f"model {spec.id!r} measured {format_bytes(size)} after loading, and no room for it can be "
                f"made within the memory budget of {format_bytes(self.memory_budget)}; {self._occupancy()}"
            )
        if copy.replaces is not None:
            self._take_over(copy)
        now = self._clock()
        copy.worker, copy.state, copy.loaded_at, copy.last_used = worker, CopyState.READY, now, now
        self._failures.pop(spec.id, None)
        if victims and self._worth_less_than(copy, victims, now):
            copy.transient = True  # serve what waits for it, keep the more valuable copies...
            # ...but what is over the budget even without it (a load admitted meanwhile) still goes.
            victims = self._victims(extra_bytes=0, extra_slots=0, exclude=spec.id, count_unloading=False,
                                    count_excluded=False) or []
        for victim in victims:
            self._begin_unload(self._copies[victim.model_id], evicted=True)
        return None

    def _worth_less_than(self, copy: _Copy, victims: list[Candidate], now: float) -> bool:
        """Admission control: would keeping `copy` cost more reloads than it saves? Its expected
        reload seconds (demand x load seconds) against those of the copies it would displace; an
        explicit load always stays."""
        if not self.admission_control or copy.kept or self.is_pinned(copy.spec.id):
            return False
        own = self._candidate(copy.spec.id, copy, now)
        return eviction_cost([own]) < eviction_cost(victims)

    def _fail_load(self, copy: _Copy, error: errors.ModelplaneError, seconds: float) -> None:
        if self._copies.get(copy.spec.id) is copy:
            del self._copies[copy.spec.id]
        self._release_promises(copy.spec.id)
        self._failures[copy.spec.id] = _Failure(error, self._clock(), copy.spec.load_key())
        if copy.replaces is not None:  # a rollout: the old copy keeps serving, and says why
            copy.replaces.replacement = None
            copy.replaces.rollout_error = f"rollout to version {copy.spec.version} failed: {error.message}"
            copy.replaces = None
        log.warning("load of %s failed: %s", copy.spec.id, error.message)
        self._observer.load_finished(copy.spec, seconds, ok=False)
        self._observer.memory_used(self.used_bytes())
        copy.loading.set_exception(error)
        copy.loading.add_done_callback(lambda future: future.exception())  # retrieved, even with no waiter
        self._admit_queued()

    def _release_promises(self, model_id: str) -> None:
        for other in self._copies.values():
            if other.promised_to == model_id:
                other.promised_to = None

    async def _discard(self, worker: FrameworkWorker) -> None:
        """Unload a worker that will not be kept (failed half-way or refused after measuring)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._load_pool, worker.unload)
        except Exception:  # noqa: BLE001 - the load error is what the caller must see
            log.exception("unloading discarded %s failed", worker.spec.id)

    # ----- eviction ------------------------------------------------------

    def _victims(self, extra_bytes: int, extra_slots: int, exclude: str | None,
                 count_unloading: bool, count_excluded: bool = True) -> list[Candidate] | None:
        """Copies to evict so that everything counted plus the extra fits; None when impossible now.
        `exclude` is never a victim (and with `count_excluded=False` not counted either).

        A new load (`count_unloading`) waits for copies being unloaded to be gone: their memory is
        not free yet. A finished load does not count them again (see `_admit_loaded`)."""
        counted = [copy for copy in self._all_copies() if copy.counts_towards_budget
                   and (count_unloading or copy.state is not CopyState.UNLOADING)
                   and (count_excluded or copy.spec.id != exclude or copy.replaces is not None)]
        bytes_needed = sum(copy.bytes for copy in counted) + extra_bytes - self.memory_budget
        slots_needed = len(counted) + extra_slots - self.max_models if self.max_models else 0
        if bytes_needed <= 0 and slots_needed <= 0:
            return []
        now = self._clock()
        candidates = [
            self._candidate(key, copy, now)
            for key, copy in self._copies.items()
            if copy.state is CopyState.READY and copy.promised_to is None and key != exclude and not self.is_pinned(key)
        ]
        return choose_victims(self.policy, candidates, bytes_needed, slots_needed)

    def _candidate(self, key: str, copy: _Copy, now: float) -> Candidate:
        stats = self._stats_of(key)
        return Candidate(
            model_id=key, bytes=copy.bytes, idle_s=now - copy.last_used, age_s=now - copy.loaded_at,
            load_seconds=self._load_cost(key), frequency=stats.demand.value(now),
            inflight=copy.inflight, queued=copy.queued,
        )

    def _begin_unload(self, copy: _Copy, evicted: bool) -> None:
        copy.state = CopyState.UNLOADING
        copy.promised_to = None
        copy.gone = asyncio.get_running_loop().create_future()
        if evicted:
            log.info("evicting %s (%s)", copy.spec.id, format_bytes(copy.bytes))
            self._observer.model_evicted(copy.spec)
        self._spawn(self._finish_unload(copy))

    async def _finish_unload(self, copy: _Copy) -> None:
        await copy.drained.wait()  # never unload under a request
        assert copy.worker is not None and copy.gone is not None
        try:
            await asyncio.get_running_loop().run_in_executor(self._load_pool, copy.worker.unload)
        except Exception:  # noqa: BLE001 - the copy is gone either way
            log.exception("unload of %s raised; dropping it anyway", copy.spec.id)
        copy.worker = None
        self._leaving.discard(copy)
        if self._copies.get(copy.spec.id) is copy:
            del self._copies[copy.spec.id]
        if copy.spec.id not in self._copies:  # a rollout's new copy keeps its series
            self._observer.model_bytes(copy.spec, None)
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
        if not any(c.state is CopyState.READY and c.spec.framework is framework for c in self._copies.values()):
            return []
        asked_at = self._clock()
        held = await held_now()
        if held is None:
            return []
        lost = [
            copy for key, copy in self._copies.items()
            if copy.state is CopyState.READY and copy.spec.framework is framework
            and copy.loaded_at <= asked_at and key not in held
        ]
        for copy in lost:
            log.warning("%s no longer holds %s (restarted?); dropping it so it loads again", framework.value, copy.spec.id)
            self._begin_unload(copy, evicted=False)
        if lost:
            self._observer.memory_used(self.used_bytes())
        return sorted(copy.spec.id for copy in lost)

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
        for ticket in self._queue.values():
            if not ticket.admitted.done():
                ticket.admitted.set_exception(errors.BackendUnavailable("the worker is shutting down"))
                ticket.admitted.add_done_callback(lambda future: future.exception())
        self._queue.clear()
        loop = asyncio.get_running_loop()
        for copy in list(self._all_copies()):
            if copy.worker is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._load_pool, copy.worker.unload)
        self._copies.clear()
        self._leaving.clear()
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
    except errors.ModelplaneError as exc:
        log.warning("pinned model not loaded: %s", exc.message)
        return False
    return True


def _as_load_error(spec: ModelSpec, exc: BaseException) -> errors.ModelplaneError:
    """Every load failure as a ModelplaneError whose message names the model and the cause."""
    if isinstance(exc, _HalfLoaded):
        exc = exc.cause
    prefix = f"loading model {spec.id!r} failed: "
    if isinstance(exc, asyncio.CancelledError):
        return errors.ModelLoadFailed(prefix + "cancelled (the worker is shutting down)")
    if isinstance(exc, errors.ModelplaneError) and not isinstance(exc, errors.BadInput):
        if repr(spec.id) not in exc.message:
            exc.message = prefix + exc.message
            exc.args = (exc.message,)
        return exc
    cause = exc.message if isinstance(exc, errors.ModelplaneError) else f"{type(exc).__name__}: {exc}"
    return errors.ModelLoadFailed(prefix + cause)
