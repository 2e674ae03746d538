"""ModelManager: the only holder of "what is in memory" in a worker pod.

Guarantees, and how they are kept:

- **Capacity in bytes.** Each copy counts its spec's estimate while it loads
  and its measured size (``FrameworkWorker.measured_bytes()``) once loaded.
  ``max_models`` optionally caps the count as well.
- **One load per model.** The first request creates the copy in state LOADING
  with a future; every later request for it awaits that same future.
- **Loads never block loaded models.** ``load()``/``unload()`` run on a small
  thread pool of their own; inference runs on another (``asyncio.to_thread``);
  the table lock is never held across either.
- **A failed load changes nothing (load first, evict after).** Before a load
  starts, the manager only *checks* that enough unpinned bytes could be freed
  (else 503 NoCapacity, or 507 ModelTooLarge when the model exceeds the whole
  budget). The load then runs into spare room or, when there is none,
  temporarily over budget; victims are evicted only after it succeeded and
  its size was measured. So missing or corrupt files, an unknown framework or
  a down sidecar evict nothing. The price: while such a load runs, memory may
  exceed the budget by that model's size, so on a GPU the budget should leave
  room for the largest model on top. A model whose measured size exceeds the
  budget is unloaded again and refused with ModelTooLarge.
- **Pinned models are never evicted** (nor unloaded through the API).
- **No unload under a request.** A victim stops taking new requests at once
  (state UNLOADING), its bytes stop counting towards the budget, and its
  ``unload()`` runs only after its in-flight requests finished. A request for
  it meanwhile waits for the unload and then loads it again.
- **A failed load is remembered, not retried on every request.** The last
  failure per model (its error and when) is reported as a FAILED copy of
  0 bytes until a later load succeeds or the model is unloaded. It holds no
  memory and is never "loaded". For ``failure_backoff_s`` after it, a request
  gets the same error at once instead of another load; after that window a
  request loads again. A sidecar that was down (BackendUnavailable) is
  re-checked at once instead: asking is cheap and the sidecar recovers alone.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy as copying
import logging
import math
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable, Protocol

from modelplane_common import errors
from modelplane_common.quantity import format_bytes
from modelplane_common.spec import Framework, ModelSpec
from modelplane_common.wire import CopyState
from modelplane_worker import engine, eviction
from modelplane_worker.frameworks.base import FrameworkWorker, WorkerContext
from modelplane_worker.store import ModelStore

log = logging.getLogger(__name__)

Preflight = Callable[[ModelSpec], Awaitable[None]]
HeldModels = Callable[[], Awaitable["set[str] | None"]]
WorkerFactory = Callable[[ModelSpec, WorkerContext], FrameworkWorker]


class ManagerObserver(Protocol):
    """What the manager reports as it works (the worker's Prometheus metrics implement it)."""

    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None: ...

    def model_evicted(self, spec: ModelSpec) -> None: ...

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None: ...

    def memory_used(self, used: int) -> None: ...


class _NoObserver:
    def load_finished(self, spec: ModelSpec, seconds: float, ok: bool) -> None:
        pass

    def model_evicted(self, spec: ModelSpec) -> None:
        pass

    def model_bytes(self, spec: ModelSpec, size: int | None) -> None:
        pass

    def memory_used(self, used: int) -> None:
        pass


@dataclass(eq=False)
class _Copy:
    """One model's copy in this pod; only the manager touches it."""

    spec: ModelSpec
    state: CopyState
    bytes: int
    loading: asyncio.Future[None]
    worker: FrameworkWorker | None = None
    inflight: int = 0
    last_used: float = 0.0
    loaded_at: float = 0.0
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.drained.set()

    @property
    def counts_towards_budget(self) -> bool:
        return self.state in (CopyState.LOADING, CopyState.READY)


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
    reason: str = ""


@dataclass(frozen=True)
class _Failure:
    """The last failed load of one model: what every retry within the back-off window answers."""

    error: errors.ModelplaneError
    at: float  # the manager's clock

    def backs_off(self) -> bool:
        return not isinstance(self.error, errors.BackendUnavailable)


@dataclass(frozen=True)
class FailedLoadView:
    """A remembered load failure, for /status (a FAILED copy) and the repository index."""

    model_id: str
    reason: str
    failed_at_s: float  # seconds since it failed
    pinned: bool


class ModelManager:
    def __init__(
        self,
        store: ModelStore,
        context: WorkerContext,
        memory_budget: int,
        *,
        max_models: int | None = None,
        policy: eviction.EvictionPolicy | None = None,
        pinned: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        observer: ManagerObserver | None = None,
        preflight: Preflight | None = None,
        create_worker: WorkerFactory = engine.create,
        load_threads: int = 2,
        failure_backoff_s: float = 5.0,
    ) -> None:
        if memory_budget <= 0:
            raise ValueError(f"memory budget must be positive, got {memory_budget}")
        if max_models is not None and max_models < 1:
            raise ValueError(f"max models must be at least 1, got {max_models}")
        if failure_backoff_s < 0:
            raise ValueError(f"failed-load back-off must not be negative, got {failure_backoff_s}")
        self.store = store
        self.context = context
        self.memory_budget = memory_budget
        self.max_models = max_models
        self.policy = policy or eviction.LRUPolicy()
        self._pinned = frozenset(pinned)
        self._clock = clock
        self._observer = observer or _NoObserver()
        self._preflight = preflight
        self._create_worker = create_worker
        self.failure_backoff_s = failure_backoff_s
        self._lock = asyncio.Lock()
        self._copies: dict[str, _Copy] = {}
        self._failures: dict[str, _Failure] = {}  # last failed load per model, until a load succeeds
        self._measured: dict[str, int] = {}  # last measured size, kept after eviction for placement
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

    def used_bytes(self) -> int:
        """Bytes held now, including copies still loading (their estimate) or being unloaded."""
        return sum(copy.bytes for copy in self._copies.values())

    def committed_bytes(self) -> int:
        """Bytes that count towards the budget: loading and ready copies."""
        return sum(copy.bytes for copy in self._copies.values() if copy.counts_towards_budget)

    def known_size(self, spec: ModelSpec) -> int:
        """The best size figure for `spec`: measured at its last load, else its estimate."""
        return self._measured.get(spec.id, spec.memory_bytes)

    def failures(self) -> dict[str, str]:
        """Reason of the last failed load per model that is neither loaded nor loading again now."""
        return {key: failure.error.message for key, failure in self._failures.items() if key not in self._copies}

    def failed_loads(self) -> list[FailedLoadView]:
        """The remembered failures (as `failures()`), with how long ago each happened."""
        now = self._clock()
        return [
            FailedLoadView(key, failure.error.message, max(0.0, now - failure.at), self.is_pinned(key))
            for key, failure in sorted(self._failures.items())
            if key not in self._copies
        ]

    def snapshot(self) -> list[CopyView]:
        now = self._clock()
        views = [
            CopyView(
                model_id=key,
                framework=copy.spec.framework.value,
                state=copy.state,
                bytes=copy.bytes,
                pinned=self.is_pinned(key),
                inflight=copy.inflight,
                last_used_s=max(0.0, now - copy.last_used) if copy.last_used else 0.0,
                loaded_at_s=max(0.0, now - copy.loaded_at) if copy.loaded_at else 0.0,
            )
            for key, copy in self._copies.items()
        ]
        return sorted(views, key=lambda view: view.model_id)

    # ----- the request path ----------------------------------------------

    @contextlib.asynccontextmanager
    async def use(self, model_id: str) -> AsyncIterator[FrameworkWorker]:
        """Get-or-load `model_id` and hold it (counted in flight) for the block."""
        copy = await self._acquire(model_id, hold=True)
        try:
            assert copy.worker is not None
            yield copy.worker
        finally:
            copy.inflight -= 1
            if copy.inflight == 0:
                copy.drained.set()

    async def load(self, model_id: str) -> None:
        """Make sure `model_id` is loaded (explicit load, pinned models, warm-up)."""
        await self._acquire(model_id, hold=False)

    async def unload(self, model_id: str) -> bool:
        """Unload `model_id` once its requests finished; False when it was not loaded.

        A loaded model that has left the store (its ServedModel was deleted) can still be unloaded."""
        if model_id not in self._copies:
            self.store.get(model_id)  # 404 for an unknown id
        if self.is_pinned(model_id):
            raise errors.Conflict(f"model {model_id!r} is pinned on this worker and cannot be unloaded")
        while True:
            async with self._lock:
                copy = self._copies.get(model_id)
                if copy is None:
                    self._failures.pop(model_id, None)
                    return False
                if copy.state is CopyState.READY:
                    self._begin_unload_locked(copy, evicted=False)
                waiter = copy.loading if copy.state is CopyState.LOADING else copy.gone
            assert waiter is not None
            with contextlib.suppress(errors.ModelplaneError):
                await asyncio.shield(waiter)
            if copy.state is CopyState.UNLOADING:
                return True

    async def _acquire(self, model_id: str, hold: bool) -> _Copy:
        spec = self.store.get(model_id)
        while True:
            async with self._lock:
                copy = self._copies.get(model_id)
                if copy is None:
                    self._raise_if_backing_off_locked(model_id)
                    copy = self._start_load_locked(spec)
                if copy.state is CopyState.READY:
                    copy.last_used = self._clock()
                    if hold:
                        copy.inflight += 1
                        copy.drained.clear()
                    return copy
                waiter = copy.loading if copy.state is CopyState.LOADING else copy.gone
            assert waiter is not None
            await asyncio.shield(waiter)  # a failed load raises its error in every waiter

    # ----- loading -------------------------------------------------------

    def _raise_if_backing_off_locked(self, model_id: str) -> None:
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

    def _start_load_locked(self, spec: ModelSpec) -> _Copy:
        estimate = spec.memory_bytes
        if estimate > self.memory_budget:
            raise errors.ModelTooLarge(
                f"model {spec.id!r} needs about {format_bytes(estimate)}, more than this worker's whole "
                f"memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        if self._victims_locked(extra_bytes=estimate, extra_slots=1, exclude=None) is None:
            raise self._no_capacity(spec, estimate)
        copy = _Copy(spec=spec, state=CopyState.LOADING, bytes=estimate, loading=asyncio.get_running_loop().create_future())
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
            # On the load thread: the first use of a framework imports its module (seconds for torch).
            worker = await loop.run_in_executor(self._load_pool, self._create_worker, spec, self.context)
            await loop.run_in_executor(self._load_pool, worker.load)
            measured = await loop.run_in_executor(self._load_pool, worker.measured_bytes)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the waiters
            error = _as_load_error(spec, exc)
            if worker is not None:
                await self._discard(worker)
            await self._fail_load(copy, error, time.perf_counter() - started)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        async with self._lock:
            refusal = self._admit_locked(copy, worker, measured)
        if refusal is not None:
            await self._discard(worker)
            await self._fail_load(copy, refusal, time.perf_counter() - started)
            return
        self._observer.load_finished(spec, time.perf_counter() - started, ok=True)
        self._observer.model_bytes(spec, copy.bytes)
        self._observer.memory_used(self.used_bytes())
        log.info("loaded %s (%s) in %.2fs", spec.id, format_bytes(copy.bytes), time.perf_counter() - started)
        copy.loading.set_result(None)

    def _admit_locked(self, copy: _Copy, worker: FrameworkWorker, measured: int) -> errors.ModelplaneError | None:
        """Make the loaded copy READY and evict what no longer fits; or say why it cannot stay."""
        spec = copy.spec
        size = self._measured[spec.id] = measured if measured > 0 else copy.bytes
        if size > self.memory_budget:
            return errors.ModelTooLarge(
                f"model {spec.id!r} measured {format_bytes(size)} after loading, more than this worker's "
                f"whole memory budget of {format_bytes(self.memory_budget)}; nothing was evicted"
            )
        copy.bytes = size
        victims = self._victims_locked(extra_bytes=0, extra_slots=0, exclude=spec.id)
        if victims is None:
            return self._no_capacity(spec, size)
        now = self._clock()
        copy.worker, copy.state, copy.loaded_at, copy.last_used = worker, CopyState.READY, now, now
        self._failures.pop(spec.id, None)
        for victim in victims:
            self._begin_unload_locked(self._copies[victim.model_id], evicted=True)
        return None

    async def _fail_load(self, copy: _Copy, error: errors.ModelplaneError, seconds: float) -> None:
        async with self._lock:
            if self._copies.get(copy.spec.id) is copy:
                del self._copies[copy.spec.id]
            self._failures[copy.spec.id] = _Failure(error, self._clock())
        log.warning("load of %s failed: %s", copy.spec.id, error.message)
        self._observer.load_finished(copy.spec, seconds, ok=False)
        self._observer.memory_used(self.used_bytes())
        copy.loading.set_exception(error)
        copy.loading.add_done_callback(lambda future: future.exception())  # retrieved, even with no waiter

    async def _discard(self, worker: FrameworkWorker) -> None:
        """Unload a worker that will not be kept (failed half-way or refused after measuring)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._load_pool, worker.unload)
        except Exception:  # noqa: BLE001 - the load error is what the caller must see
            log.exception("unloading discarded %s failed", worker.spec.id)

    # ----- eviction ------------------------------------------------------

    def _victims_locked(self, extra_bytes: int, extra_slots: int, exclude: str | None) -> list[eviction.Candidate] | None:
        """Copies to evict so that everything counted plus the extra fits; None when impossible."""
        counted = [copy for copy in self._copies.values() if copy.counts_towards_budget]
        bytes_needed = sum(copy.bytes for copy in counted) + extra_bytes - self.memory_budget
        slots_needed = len(counted) + extra_slots - self.max_models if self.max_models else 0
        candidates = [
            eviction.Candidate(key, copy.bytes, copy.last_used, copy.loaded_at, copy.inflight)
            for key, copy in self._copies.items()
            if copy.state is CopyState.READY and key != exclude and not self.is_pinned(key)
        ]
        return eviction.choose_victims(self.policy, candidates, self._clock(), bytes_needed, slots_needed)

    def _no_capacity(self, spec: ModelSpec, size: int) -> errors.NoCapacity:
        pinned = [key for key in self._copies if self.is_pinned(key)]
        loading = [key for key, copy in self._copies.items() if copy.state is CopyState.LOADING and key != spec.id]
        return errors.NoCapacity(
            f"no room for model {spec.id!r} ({format_bytes(size)}) within the memory budget of "
            f"{format_bytes(self.memory_budget)}"
            + (f" and the limit of {self.max_models} models" if self.max_models else "")
            + f"; pinned: {', '.join(pinned) or 'none'}; still loading: {', '.join(loading) or 'none'}"
        )

    def _begin_unload_locked(self, copy: _Copy, evicted: bool) -> None:
        copy.state = CopyState.UNLOADING
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
        async with self._lock:
            if self._copies.get(copy.spec.id) is copy:
                del self._copies[copy.spec.id]
        self._observer.model_bytes(copy.spec, None)
        self._observer.memory_used(self.used_bytes())
        copy.gone.set_result(None)

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
        async with self._lock:
            lost = [
                copy for key, copy in self._copies.items()
                if copy.state is CopyState.READY and copy.spec.framework is framework
                and copy.loaded_at <= asked_at and key not in held
            ]
            for copy in lost:
                log.warning("%s no longer holds %s (restarted?); dropping it so it loads again", framework.value, copy.spec.id)
                self._begin_unload_locked(copy, evicted=False)
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
        """Forever: load pinned models, also ones the store gains later; back off while loads fail."""
        delay = check_s
        while True:
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
        loop = asyncio.get_running_loop()
        for copy in list(self._copies.values()):
            if copy.worker is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._load_pool, copy.worker.unload)
        self._copies.clear()
        self._load_pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _attempt(awaitable: Awaitable[None]) -> bool:
    try:
        await awaitable
    except errors.ModelplaneError as exc:
        log.warning("pinned model not loaded: %s", exc.message)
        return False
    return True


def _as_load_error(spec: ModelSpec, exc: BaseException) -> errors.ModelplaneError:
    """Every load failure as a ModelplaneError whose message names the model and the cause."""
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
