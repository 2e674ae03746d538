"""Getting a model ready somewhere when no pod has it, and taking copies away.

- One load per model at a time across the router however many callers
  wait (``ensure_ready_copies``: the admin load, the copy loop's minimum
  copies); the waiters return when it finishes.
- A load another router started shows in the workers' reports and is joined
  instead of repeated; nothing polls for a fresher report (reports are
  stamped: model_map.py).
- A pod that vanishes mid-load costs one more placement; a pod that refuses
  (its queue is full: 503) costs one retry on another pod.

Requests do not come here: a request with no ready copy goes itself to the
pod that loads its model (forwarding.py).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from hotset_common import errors
from hotset_router import placement
from hotset_router.deadlines import Deadlines
from hotset_router.model_map import ModelMap
from hotset_router.status_sync import StatusSync
from hotset_router.targets import Targets
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PodUnreachable, WorkerClient, WorkerError

log = logging.getLogger("hotset_router.routing")


class Loads:
    def __init__(self, model_map: ModelMap, client: Callable[[], WorkerClient], sync: StatusSync, targets: Targets,
                 metrics: RouterMetrics, deadlines: Deadlines, retry_after_s: int) -> None:
        self.model_map = model_map
        self._client = client  # the router's current client (tests replace it on the router)
        self.sync = sync
        self.targets = targets
        self.metrics = metrics
        self.deadlines = deadlines
        self.retry_after_s = retry_after_s
        self.in_flight: dict[str, asyncio.Future[str | None]] = {}  # model -> its load (one at a time)

    @property
    def client(self) -> WorkerClient:
        return self._client()

    def track(self, model: str, future: asyncio.Future[str | None]) -> None:
        """`future` is `model`'s load until it is done."""
        self.in_flight[model] = future
        future.add_done_callback(lambda f, m=model: self.in_flight.pop(m, None) if self.in_flight.get(m) is f else None)

    async def ensure_ready_copies(self, model: str, deadline: float | None = None) -> list[str]:
        """Ready copies of `model`, loading one first (once, however many callers wait) if it has none;
        waiting at most until `deadline`."""
        urls = self.model_map.ready_copies(model)
        if urls:
            return urls
        self.targets.check_known(model)
        if deadline is None:  # a load outside a request (minimum copies): as long as the model's loads may take
            own = self.model_map.load_timeout_s(model)
            deadline = self.deadlines.deadline() if own is None else asyncio.get_running_loop().time() + own
        future = self.in_flight.get(model)
        if future is None:
            future = asyncio.ensure_future(self._load_cold(model, self.deadlines.time_left(deadline)))
            self.track(model, future)
        try:
            loaded_on = await asyncio.wait_for(asyncio.shield(future), self.deadlines.time_left(deadline))
        except (asyncio.TimeoutError, TimeoutError):
            raise errors.NoCapacity(
                f"model {model!r} is still being loaded and the request's deadline passed", self.retry_after_s
            ) from None
        # The map keeps the copy it saw loaded over older reports; a worker that reported itself
        # unready since (its Triton sidecar loading, say) still answers for the copy it just loaded.
        urls = self.model_map.ready_copies(model)
        if urls:
            return urls
        if loaded_on and self.model_map.pod(loaded_on) is not None:
            return [loaded_on]
        raise errors.BackendUnavailable(f"model {model!r} was loaded but no ready copy is reachable", self.retry_after_s)

    async def _load_cold(self, model: str, timeout_s: float) -> str | None:
        """Load `model` somewhere; the pod it was loaded on (None: it was ready already)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        time_left = self.deadlines.time_left
        if self.model_map.ready_copies(model):
            return None
        for url in self.model_map.loading_copies(model):  # another router is loading it: join that load
            try:
                await self.client.load(url, model, time_left(deadline), self.model_map.load_timeout_s(model))
                self.model_map.record_loaded(url, model, self.model_map.estimated_bytes(model))
                return url
            except PodUnreachable:
                self.model_map.remove_pod(url)
        self.targets.check_known(model)
        tried: set[str] = set()
        last: Exception | None = None
        for _ in range(max(2, len(self.model_map.pods()))):
            decision = self.targets.place(model, holders=(), exclude=tried)
            try:
                await self.load_on(decision, model, time_left(deadline))
                return decision.url
            except PodUnreachable as exc:  # a pod that vanished mid-load costs one more placement
                self.model_map.remove_pod(exc.url)
                last = exc
            except WorkerError as exc:
                if exc.status_code != 503 or time_left(deadline) <= 0:
                    raise
                # That pod's queue was full or its wait too long: another pod may have room.
                log.info("%s refused %s (%s); placing it elsewhere", decision.url, model, exc.message)
                await self.sync.refresh(decision.url)
                tried.add(decision.url)
                last = exc
            if not self.targets.others_to_try(model, tried):
                break
        if isinstance(last, errors.HotsetError):
            raise last
        raise errors.BackendUnavailable(f"no worker could load {model!r}", self.retry_after_s)

    async def load_on(self, decision: placement.Decision, model: str, timeout_s: float | None = None) -> None:
        need = self.model_map.estimated_bytes(model)
        self.model_map.reserve_load(decision.url, model, need)
        log.info("loading %s on %s (%s; evicts %s)", model, decision.url, decision.reason, list(decision.evicts))
        try:
            await self.client.load(decision.url, model, timeout_s, self.model_map.load_timeout_s(model))
        finally:
            self.model_map.release_load(decision.url, model)
        self.model_map.record_loaded(decision.url, model, need)
        self.metrics.placed(model, decision.reason)

    async def unload_everywhere(self, model: str) -> list[str]:
        """Unload every copy of `model`; the pods it left."""
        self.targets.check_known(model)
        left = []
        for pod, _ in self.model_map.copies_of(model):
            await self.client.unload(pod.url, model)
            self.model_map.record_unloaded(pod.url, model)
            left.append(pod.name)
        return left
