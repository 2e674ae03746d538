"""The background copy loop: minimum copies, hot copies, idle extra copies, copies off draining pods.

Each pass looks only at the models that can need something, never at the
whole catalog: those whose copies, catalog entries or reservations changed
since the last pass (``ModelMap.take_changed``), whose spec changed
(discovery), whose back-off ended, whose request rate passes one copy's
threshold or that have requests in flight (only those can be hot), that have extra
copies (only those can lose one) and that have copies on draining pods. The
first pass looks at every known model once. An idle cluster costs a pass
next to nothing, whatever its catalog holds, and a busy one what its
traffic needs (the models fast enough to be hot or with requests in flight).

The pass runs in chunks of ``chunk`` models and yields to the event loop
between them, so requests are never held up behind it however many models
need a look (10,000 models at once at start-up, say).

- A model below its ``replicas.min`` gets a copy (one load at a time; a
  background load that fails, no capacity say, is retried with a doubling
  back-off, not every pass).
- ``ReplicationPolicy`` decides hot and idle copies from the workers'
  demand; one router replica per model carries decisions out (replicas.py).
- A draining pod's copies that are still wanted are loaded elsewhere first.
- ``placement: dedicated`` models are left alone: their copies are the pods
  of their own group, which pin them.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Awaitable, Callable, Iterable

from hotset_common import errors
from hotset_common.wire import CopyState
from hotset_router.loads import Loads
from hotset_router.model_map import ModelMap
from hotset_router.replication import Action, ModelLimits, ReplicationPolicy
from hotset_router.targets import LimitsLookup, Targets
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PodUnreachable, WorkerClient, WorkerError

FIRST_RETRY_S = 2.0  # back-off after a failed background load (minimum copies, hot copy), doubling
MAX_RETRY_S = 60.0
DEFAULT_CHUNK = 100  # models looked at between two yields to the event loop

log = logging.getLogger("hotset_router.routing")


async def _yield_to_requests() -> None:
    await asyncio.sleep(0)


class CopyLoop:
    def __init__(self, model_map: ModelMap, loads: Loads, targets: Targets, policy: ReplicationPolicy,
                 limits_for: Callable[[], LimitsLookup], client: Callable[[], WorkerClient], metrics: RouterMetrics,
                 clock: Callable[[], Callable[[], float]], owns: Callable[[str], bool] = lambda model: True,
                 changed_specs: Callable[[], Iterable[str]] = lambda: (), chunk: int = DEFAULT_CHUNK,
                 pause: Callable[[], Awaitable[None]] = _yield_to_requests) -> None:
        self.model_map = model_map
        self.loads = loads
        self.targets = targets
        self.policy = policy
        self._limits_for = limits_for  # the router's current lookups (tests replace them on the router)
        self._client = client
        self._clock = clock
        self.metrics = metrics
        self.owns = owns  # whether this replica acts for a model (replicas.py)
        self.changed_specs = changed_specs  # models whose spec changed since the last call (discovery)
        self.chunk = chunk
        self.pause = pause
        self.considered = 0  # models looked at in all (tests: the work a pass does)
        self._first = True
        self._retry: dict[str, tuple[float, float]] = {}  # model -> (no background load before, last delay)
        self._due: list[tuple[float, str]] = []  # (when, model): back-offs, soonest first
        self.background: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return self._clock()()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # --- one pass ---------------------------------------------------------------------

    def due(self, now: float) -> list[str]:
        """The models this pass looks at (see the module docstring); some may be listed twice."""
        models = self.model_map.take_changed()
        models.update(self.changed_specs())
        while self._due and self._due[0][0] <= now:
            models.add(heapq.heappop(self._due)[1])
        models.update(self.policy.fast_models())
        models.update(self.model_map.busy_models())
        models.update(self.model_map.multi_copy_models())
        models.update(self.model_map.models_on_draining_pods())
        if self._first:  # every model once: listed, not merged (a merge of 10,000 names is one long step)
            self._first = False
            return [*models, *self.model_map.model_names()]
        return list(models)

    async def pass_once(self) -> None:
        """One pass of the loop: minimum copies first, then hot/idle replication, `chunk` models at a time."""
        now = self.now()
        looked_at: set[str] = set()
        for model in self.due(now):
            if model in looked_at:
                continue
            if looked_at and len(looked_at) % self.chunk == 0:
                await self.pause()
            looked_at.add(model)
            self.considered += 1
            self.consider(model, now)

    def consider(self, model: str, now: float) -> None:
        if model in self.loads.in_flight or now < self._retry.get(model, (0.0, 0.0))[0]:
            return
        if not self.model_map.is_known(model):
            return
        limits = self._limits_for()(model)
        if limits.dedicated:
            return  # its own pods pin it; it is never placed on a pod of another pool
        ready = self.model_map.ready_copies(model)
        loading = self.model_map.loading_copies(model)
        acts = self.owns(model)
        if acts and self._move_off_draining(model, limits, ready, loading):
            return
        if len(ready) + len(loading) < limits.min_copies:
            if acts:
                self._start_load(model, ready, reason="min")
            return
        inflight = max(self.model_map.model_inflight(model), self.model_map.reported_load(model))
        action = self.policy.decide(model, len(ready), len(loading), inflight, limits)
        if action is not None and acts:  # every replica decides alike; one acts
            self._carry_out(action, ready)

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:  # the loop must outlive one bad pass
                log.exception("control loop pass failed")
            await asyncio.sleep(interval_s)

    # --- what a pass starts -------------------------------------------------------------

    def _move_off_draining(self, model: str, limits: ModelLimits, ready: list[str], loading: list[str]) -> bool:
        """A pod the operator drains loses its copies with it: load elsewhere those still wanted (its
        min copies, or 1 when a copy there was used within the model's idle time). True: started."""
        draining = [(p, c) for p, c in self.model_map.copies_of(model)
                    if p.draining and p.ready and c.state == CopyState.READY]
        if not draining:
            return False
        staying = [u for u in ready if not self.model_map.pod(u) or not self.model_map.pod(u).draining]
        now = self.model_map.now()
        used = any(c.frequency > 0 and c.idle_s(now) < limits.idle_s for _, c in draining)
        wanted = max(limits.min_copies, 1 if used else 0)
        if len(staying) + len(loading) >= wanted:
            return False
        self._start_load(model, sorted({*ready, *(p.url for p, _ in draining)}), reason="move")
        return True

    def _carry_out(self, action: Action, ready: list[str]) -> None:
        if action.kind == "add":
            self._start_load(action.model, ready, reason="hot")
        elif action.kind == "remove":
            self.spawn(self._remove_copy(action.model, ready))

    def _start_load(self, model: str, holders: list[str], reason: str) -> None:
        """Start adding a copy in the background; the model counts as loading until it is done."""

        async def first_copy() -> None:
            try:
                await self.loads.ensure_ready_copies(model)  # registers its own single-flight load
            except (errors.HotsetError, PodUnreachable) as exc:
                self._back_off(model, f"could not load {model} ({reason})", exc)
            else:
                self._retry.pop(model, None)

        async def extra_copy() -> str | None:
            try:
                await self.loads.load_on(self.targets.place(model, holders), model)
            except (errors.HotsetError, PodUnreachable) as exc:
                self._back_off(model, f"could not add a copy of {model} ({reason})", exc)
            else:
                self._retry.pop(model, None)
            return None

        if not holders:
            self.spawn(first_copy())
            return
        self.loads.track(model, asyncio.ensure_future(extra_copy()))

    def _back_off(self, model: str, what: str, exc: Exception) -> None:
        """No background load of `model` for a while: the condition (no room, say) rarely clears in a second."""
        _, last = self._retry.get(model, (0.0, 0.0))
        delay = min(MAX_RETRY_S, max(FIRST_RETRY_S, 2 * last))
        when = self.now() + delay
        self._retry[model] = (when, delay)
        heapq.heappush(self._due, (when, model))
        log.warning("%s: %s; next try in %.0f s", what, exc, delay)

    async def _remove_copy(self, model: str, ready: list[str]) -> None:
        candidates = [
            (self.model_map.inflight(u, model), u) for u in ready
            if (pod := self.model_map.pod(u)) and (copy := pod.copies.get(model)) and not copy.pinned
        ]
        if len(ready) < 2 or not candidates:
            return
        _, url = min(candidates)
        try:
            await self._client().unload(url, model)
        except (WorkerError, PodUnreachable, errors.UpstreamTimeout) as exc:
            log.warning("could not remove a copy of %s from %s: %s", model, url, exc)
            return
        self.model_map.record_unloaded(url, model)
        self.metrics.removed(model)
        log.info("removed an idle extra copy of %s from %s", model, url)
