"""Which pod serves a request, and getting a model ready somewhere when no pod has it.

- A model with ready copies goes to the less busy of two random copies
  (power of two choices on the router's in-flight counts).
- A model with no ready copy is placed (``placement.place_cold``) and loaded:
  one load per model at a time across the router however many requests
  wait; the waiters are forwarded when it finishes. A load another router
  started shows in the workers' reports and is joined instead of repeated;
  nothing polls for a fresher report (reports are stamped: model_map.py).
- A connection failure or 5xx is retried once on another ready copy; the pod
  leaves the map (connection failure) or the copy is skipped until the
  worker's next report (5xx). A worker's 4xx goes back to the client as is.
- Hot models get copies and lose them again through ``replication``.
- The control loop leaves ``placement: dedicated`` models alone: their copies
  are the pods of their own group, which pin them. A background load that
  fails (no capacity, say) is retried with a doubling back-off, not every pass.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from modelplane_common import errors
from modelplane_common.quantity import format_bytes
from modelplane_common.wire import TIMEOUT_HEADER, VARIANT_HEADER, CopyState, parse_timeout
from modelplane_router import placement, prefix_routing
from modelplane_router.model_map import ModelMap
from modelplane_router.pod_waiter import PodWaiter
from modelplane_router.replication import Action, ModelLimits, ReplicationPolicy
from modelplane_router.status_sync import StatusSync
from modelplane_router.telemetry import RouterMetrics
from modelplane_router.upstream import PodUnreachable, UpstreamResponse, UpstreamStream, WorkerClient, WorkerError

FIRST_RETRY_S = 2.0  # back-off after a failed background load (minimum copies, hot copy), doubling
MAX_RETRY_S = 60.0

log = logging.getLogger(__name__)

LimitsLookup = Callable[[str], ModelLimits]
Answer = TypeVar("Answer", UpstreamResponse, UpstreamStream)  # what one attempt at a pod returns


class Router:
    def __init__(
        self,
        model_map: ModelMap,
        client: WorkerClient,
        sync: StatusSync,
        policy: ReplicationPolicy,
        limits_for: LimitsLookup,
        metrics: RouterMetrics,
        placement_settings: placement.PlacementSettings = placement.PlacementSettings(),
        rng: random.Random | None = None,
        retry_after_s: int = 5,
        eligible: Callable[[str, str], bool] = lambda model, url: True,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 60.0,
    ) -> None:
        self.model_map = model_map
        self.client = client
        self.sync = sync
        self.policy = policy
        self.limits_for = limits_for
        self.metrics = metrics
        self.placement_settings = placement_settings
        self.rng = rng or random.Random()
        self.retry_after_s = retry_after_s
        self.eligible = eligible  # (model, pod url) -> may a new copy go there (dedicated pools)
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        self._loads: dict[str, asyncio.Future[str | None]] = {}
        self._retry: dict[str, tuple[float, float]] = {}  # model -> (no background load before, last delay)
        self._background: set[asyncio.Task[None]] = set()
        self.pod_waiter: PodWaiter | None = None  # cluster mode: hold a request while a pod of its model starts

    # --- choosing a copy --------------------------------------------------------------

    def choose_copy(self, model: str, urls: list[str]) -> str:
        """Power of two choices: the less busy of two random ready copies."""
        if len(urls) == 1:
            return urls[0]
        a, b = self.rng.sample(urls, 2)
        return a if self.model_map.inflight(a, model) <= self.model_map.inflight(b, model) else b

    def check_known(self, model: str) -> None:
        if not self.model_map.is_known(model):
            if not self.model_map.pods():
                raise errors.BackendUnavailable("no worker pod is reachable", self.retry_after_s)
            if self.limits_for(model).dedicated:
                raise errors.BackendUnavailable(f"no dedicated pod of {model!r} is ready yet", self.retry_after_s)
            raise errors.ModelNotFound(f"model {model!r} is not served by any worker")

    def deadline(self, headers: Mapping[str, str] | None = None) -> float:
        """When a request must be answered (event-loop time): the router's request timeout, or the
        caller's shorter ``X-Modelplane-Timeout``."""
        asked = parse_timeout((headers or {}).get(TIMEOUT_HEADER))
        budget = self.request_timeout_s if asked is None else min(self.request_timeout_s, asked)
        return asyncio.get_running_loop().time() + budget

    def time_left(self, deadline: float) -> float:
        return max(0.0, deadline - asyncio.get_running_loop().time())

    async def ensure_ready_copies(self, model: str, deadline: float | None = None) -> list[str]:
        """Ready copies of `model`, loading one first (once, however many callers wait) if it has none;
        waiting at most until `deadline`."""
        urls = self.model_map.ready_copies(model)
        if urls:
            return urls
        self.check_known(model)
        deadline = deadline if deadline is not None else self.deadline()
        future = self._loads.get(model)
        if future is None:
            future = asyncio.ensure_future(self._load_cold(model, self.time_left(deadline)))
            self._loads[model] = future
            future.add_done_callback(lambda f, m=model: self._loads.pop(m, None) if self._loads.get(m) is f else None)
        try:
            loaded_on = await asyncio.wait_for(asyncio.shield(future), self.time_left(deadline))
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

    # --- placing a cold model ------------------------------------------------------------

    async def _load_cold(self, model: str, timeout_s: float) -> str | None:
        """Load `model` somewhere; the pod it was loaded on (None: it was ready already)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        if self.model_map.ready_copies(model):
            return None
        for url in self.model_map.loading_copies(model):  # another router is loading it: join that load
            try:
                await self.client.load(url, model, self.time_left(deadline))
                self.model_map.record_loaded(url, model, self.model_map.estimated_bytes(model))
                return url
            except PodUnreachable:
                self.model_map.remove_pod(url)
        self.check_known(model)
        tried: set[str] = set()
        last: Exception | None = None
        for _ in range(max(2, len(self.model_map.pods()))):
            decision = self.place(model, holders=(), exclude=tried)
            try:
                await self.load_on(decision, model, self.time_left(deadline))
                return decision.url
            except PodUnreachable as exc:  # a pod that vanished mid-load costs one more placement
                self.model_map.remove_pod(exc.url)
                last = exc
            except WorkerError as exc:
                if exc.status_code != 503 or self.time_left(deadline) <= 0:
                    raise
                # That pod's queue was full or its wait too long: another pod may have room.
                log.info("%s refused %s (%s); placing it elsewhere", decision.url, model, exc.message)
                await self.sync.refresh(decision.url)
                tried.add(decision.url)
                last = exc
            if not self._others_to_try(model, tried):
                break
        if isinstance(last, errors.ModelplaneError):
            raise last
        raise errors.BackendUnavailable(f"no worker could load {model!r}", self.retry_after_s)

    def _others_to_try(self, model: str, tried: set[str]) -> bool:
        return any(p.url not in tried and self.eligible(model, p.url) for p in self.model_map.pods_with_catalog(model))

    def place(self, model: str, holders: tuple[str, ...] | list[str], exclude: set[str] | frozenset[str] = frozenset()) -> placement.Decision:
        need = self.model_map.estimated_bytes(model)
        capable = {p.url for p in self.model_map.pods_with_catalog(model) if self.eligible(model, p.url) and p.url not in exclude}
        rooms = [r for r in placement.rooms_from_map(self.model_map) if r.url in capable]
        if holders:
            decision = placement.place_replica(model, need, rooms, holders, self.placement_settings)
        else:
            decision = placement.place_cold(model, need, rooms, self.placement_settings)
        if decision is None:
            if not capable:
                raise errors.NoCapacity(f"no ready worker pod can take {model!r} now", self.retry_after_s)
            raise errors.NoCapacity(
                f"no worker pod has room for {model!r} ({format_bytes(need)}) even with every unpinned model evicted",
                self.retry_after_s,
            )
        return decision

    async def load_on(self, decision: placement.Decision, model: str, timeout_s: float | None = None) -> None:
        need = self.model_map.estimated_bytes(model)
        self.model_map.reserve_load(decision.url, model, need)
        pod = self.model_map.pod(decision.url)
        log.info("loading %s on %s (%s; evicts %s)", model, decision.url, decision.reason, list(decision.evicts))
        try:
            await self.client.load(decision.url, model, timeout_s)
        finally:
            self.model_map.release_load(decision.url, model)
        self.model_map.record_loaded(decision.url, model, need)
        self.metrics.placements.labels(model, pod.name if pod else decision.url, decision.reason).inc()

    # --- forwarding -----------------------------------------------------------------------

    async def forward(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                      load: bool = True) -> UpstreamResponse:
        """Send a request for `model` to a copy within its deadline, retrying once elsewhere on failure.

        With no ready copy, the request itself goes to the pod where the model is loading or where
        placement puts it: the worker loads it for this request (one load, however many requests
        join) and serves it as soon as it is ready, before the copy could be evicted. `load=False`
        (metadata): never place a copy; any pod that can load the model answers from its store."""
        deadline = self.deadline(headers)
        if load:
            await self.hold_for_pod(model, deadline)
            if "/versions/" not in path:  # a request that names a version gets that version
                model, headers = self.with_variant(model, headers)

        async def attempt(url: str, cold: bool) -> UpstreamResponse | None:
            return await self._try(url, model, method, path, body, headers, deadline, cold and load)

        return await self._with_one_retry(model, deadline, lambda tried: self._target(model, tried, load), attempt)

    async def _with_one_retry(self, model: str, deadline: float, target: Callable[[list[str]], tuple[str, Any] | None],
                              attempt: Callable[[str, Any], Awaitable[Answer | None]],
                              discard: Callable[[Answer], None] = lambda _: None) -> Answer:
        """Try `model`'s next target (`target(tried)`: (url, what the attempt needs), None: nowhere
        left), and once more elsewhere if the pod did not answer or answered 5xx, within `deadline`.
        A 5xx with no other copy to try is the answer; an answer replaced by a later one is
        `discard`ed (a stream's is closed)."""
        tried: list[str] = []
        kept: Answer | None = None
        for number in range(2):
            found = target(tried)
            if found is None:
                break
            url, needs = found
            if number == 0:
                self.policy.record_request(model)  # only known models: unknown names must not grow the policy's table
            else:
                self.metrics.retries.labels(model).inc()
            answer = await attempt(url, needs)
            if answer is not None:
                if kept is not None:
                    discard(kept)
                if answer.status_code < 500:
                    return answer
                kept = answer
            tried.append(url)
            if self.time_left(deadline) <= 0:
                break
        if kept is not None:
            return kept  # a 5xx with no other copy to try: the worker's answer stands
        raise errors.BackendUnavailable(f"no ready copy of {model!r} answered", self.retry_after_s)

    async def hold_for_pod(self, model: str, deadline: float) -> None:
        """Scale from zero: with no pod able to serve `model`, wait (within `deadline`) while one starts
        (pod_waiter.py); at once otherwise, and always in standalone mode."""
        if self.pod_waiter is not None:
            await self.pod_waiter.wait(model, deadline)

    def with_variant(self, model: str, headers: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """The model (or canary version) this request goes to, and the headers that tell the worker."""
        chosen = self.choose_variant(model)
        return (model, headers) if chosen == model else (chosen, {**headers, VARIANT_HEADER: chosen})

    def choose_variant(self, model: str) -> str:
        """`model`, or its canary version for the canary's weight in percent of the requests."""
        canary = self.model_map.canary_of(model)
        if canary is None:
            return model
        variant, weight = canary
        return variant if self.rng.random() * 100 < weight else model

    def _target(self, model: str, tried: list[str], load: bool) -> tuple[str, bool] | None:
        """Where the next attempt goes: a ready copy; else a copy loading now; else a new placement
        (reserved in the map, so requests arriving meanwhile join it). (url, cold); None: nowhere left."""
        ready = [u for u in self.model_map.ready_copies(model) if u not in tried]
        if ready:
            return self.choose_copy(model, ready), False
        loading = [u for u in self.model_map.loading_copies(model) if u not in tried]
        if loading:
            return self.choose_copy(model, loading), True
        if tried and not self._others_to_try(model, set(tried)):
            return None
        self.check_known(model)
        if not load:
            capable = [p.url for p in self.model_map.pods_with_catalog(model) if p.url not in tried]
            if not capable:
                raise errors.BackendUnavailable(f"no ready worker pod can describe {model!r}", self.retry_after_s)
            return self.choose_copy(model, capable), True
        decision = self.place(model, holders=(), exclude=set(tried))
        self.model_map.reserve_load(decision.url, model, self.model_map.estimated_bytes(model))
        pod = self.model_map.pod(decision.url)
        self.metrics.placements.labels(model, pod.name if pod else decision.url, decision.reason).inc()
        log.info("placing %s on %s (%s; evicts %s)", model, decision.url, decision.reason, list(decision.evicts))
        return decision.url, True

    async def _try(self, url: str, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                   deadline: float, loads: bool = False) -> UpstreamResponse | None:
        """One attempt within `deadline` (the worker is told the time left); None if the pod did not
        answer. `loads`: this request loads the model there."""
        self.model_map.begin_request(url, model)
        response: UpstreamResponse | None = None
        left = self.time_left(deadline)
        try:
            response = await self.client.forward(url, method, path, body, {**headers, TIMEOUT_HEADER: f"{max(left, 0.001):.3f}"},
                                                 timeout_s=left + 0.5)  # the worker answers its own deadline first
        except PodUnreachable as exc:
            log.warning("%s", exc)
            # A dead pod also fails its status call and leaves the map at once; a stale
            # keep-alive connection on a live pod does not cost the pod its place.
            await self.sync.refresh(url)
            return None
        finally:
            self.model_map.end_request(url, model)
            if loads:
                if response is not None and response.status_code == 200:
                    self.model_map.record_loaded(url, model, self.model_map.estimated_bytes(model))
                else:
                    self.model_map.release_load(url, model)
        if response.status_code >= 500:
            log.warning("worker %s answered %s for %s", url, response.status_code, model)
            self.model_map.mark_copy_failed(url, model)
        return response

    # --- streaming (OpenAI routes) -----------------------------------------------------------

    async def open_stream(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                          prefix: str = "", base: str = "") -> UpstreamStream:
        """``forward`` for answers that stream: the same targets, but the answer is returned as soon as
        it starts, for the caller to pass on chunk by chunk and close (the copy counts the request in
        flight until then). Among ready copies, a non-empty prompt `prefix` picks the copy that has
        it cached while that copy has room (prefix_routing). A LoRA adapter (`base`: its base model)
        with no copy goes where its base is loaded. A pod that fails, or answers 5xx, before its
        answer starts costs one retry elsewhere; once an answer streams, it is the answer."""
        deadline = self.deadline(headers)
        await self.hold_for_pod(model, deadline)

        async def attempt(url: str, loads: tuple[str, ...]) -> UpstreamStream | None:
            return await self._open(url, model, method, path, body, headers, deadline, loads)

        return await self._with_one_retry(model, deadline, lambda tried: self._stream_target(model, tried, prefix, base),
                                          attempt, discard=lambda stream: stream.close())

    def _stream_target(self, model: str, tried: list[str], prefix: str, base: str) -> tuple[str, tuple[str, ...]] | None:
        """(url, models this request loads there); None: nowhere left to try."""
        ready = [u for u in self.model_map.ready_copies(model) if u not in tried]
        if ready:
            if prefix:
                return prefix_routing.choose(prefix, ready, lambda u: self.model_map.inflight(u, model)), ()
            return self.choose_copy(model, ready), ()
        if base and not [u for u in self.model_map.loading_copies(model) if u not in tried]:
            capable = {p.url for p in self.model_map.pods_with_catalog(model) if self.eligible(model, p.url)}
            with_base = [u for u in self.model_map.ready_copies(base) if u in capable and u not in tried]
            if with_base:  # an adapter loads in moments where its base is: no placement of its own
                url = prefix_routing.choose(prefix, with_base, lambda u: self.model_map.inflight(u, base))
                self.model_map.reserve_load(url, model, self.model_map.estimated_bytes(model))
                return url, (model,)
        target = self._target(model, tried, load=True)
        if target is None:
            return None
        url, cold = target
        return url, (model,) if cold else ()

    async def _open(self, url: str, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                    deadline: float, loads: tuple[str, ...]) -> UpstreamStream | None:
        """One attempt; None if the pod did not answer. In flight on the copy until the answer is closed."""
        self.model_map.begin_request(url, model)
        left = self.time_left(deadline)
        answer: UpstreamStream | None = None
        try:
            answer = await self.client.open(url, method, path, body, {**headers, TIMEOUT_HEADER: f"{max(left, 0.001):.3f}"},
                                            timeout_s=left + 0.5, idle_timeout_s=self.request_timeout_s)
        except PodUnreachable as exc:
            log.warning("%s", exc)
            await self.sync.refresh(url)
            return None
        finally:
            for loaded in loads:
                if answer is not None and answer.status_code == 200:
                    self.model_map.record_loaded(url, loaded, self.model_map.estimated_bytes(loaded))
                else:
                    self.model_map.release_load(url, loaded)
            if answer is None:
                self.model_map.end_request(url, model)
        answer.on_close(lambda: self.model_map.end_request(url, model))
        if answer.status_code >= 500:
            log.warning("worker %s answered %s for %s", url, answer.status_code, model)
            self.model_map.mark_copy_failed(url, model)
        return answer

    # --- admin ------------------------------------------------------------------------------

    async def unload_everywhere(self, model: str) -> list[str]:
        """Unload every copy of `model`; the pods it left."""
        self.check_known(model)
        left = []
        for pod, _ in self.model_map.copies_of(model):
            await self.client.unload(pod.url, model)
            self.model_map.record_unloaded(pod.url, model)
            left.append(pod.name)
        return left

    # --- replication and minimum copies ------------------------------------------------------

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def reconcile_once(self) -> None:
        """One pass of the control loop: minimum copies first, then hot/idle replication."""
        now = self.clock()
        for model in sorted(self.model_map.known_models()):
            if model in self._loads or now < self._retry.get(model, (0.0, 0.0))[0]:
                continue
            limits = self.limits_for(model)
            if limits.dedicated:
                continue  # its own pods pin it; it is never placed on a pod of another pool
            ready = self.model_map.ready_copies(model)
            loading = self.model_map.loading_copies(model)
            if self._move_off_draining(model, limits, ready, loading):
                continue
            if len(ready) + len(loading) < limits.min_copies:
                self._start_load(model, ready, reason="min")
                continue
            action = self.policy.decide(model, len(ready), len(loading), self.model_map.model_inflight(model), limits)
            if action is not None:
                self._carry_out(action, ready)

    def _move_off_draining(self, model: str, limits: ModelLimits, ready: list[str], loading: list[str]) -> bool:
        """A pod the operator drains loses its copies with it: load elsewhere those still wanted (its
        min copies, or 1 when a copy there was used within the model's idle time). True: started."""
        draining = [(p, c) for p, c in self.model_map.copies_of(model)
                    if p.draining and p.ready and c.state == CopyState.READY]
        if not draining:
            return False
        staying = [u for u in ready if not self.model_map.pod(u) or not self.model_map.pod(u).draining]
        used = any(c.frequency > 0 and c.last_used_s < limits.idle_s for _, c in draining)
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
                await self.ensure_ready_copies(model)  # registers its own single-flight load
            except (errors.ModelplaneError, PodUnreachable) as exc:
                self._back_off(model, f"could not load {model} ({reason})", exc)
            else:
                self._retry.pop(model, None)

        async def extra_copy() -> None:
            try:
                await self.load_on(self.place(model, holders), model)
            except (errors.ModelplaneError, PodUnreachable) as exc:
                self._back_off(model, f"could not add a copy of {model} ({reason})", exc)
            else:
                self._retry.pop(model, None)

        if not holders:
            self.spawn(first_copy())
            return
        future = asyncio.ensure_future(extra_copy())
        self._loads[model] = future
        future.add_done_callback(lambda f, m=model: self._loads.pop(m, None) if self._loads.get(m) is f else None)

    def _back_off(self, model: str, what: str, exc: Exception) -> None:
        """No background load of `model` for a while: the condition (no room, say) rarely clears in a second."""
        _, last = self._retry.get(model, (0.0, 0.0))
        delay = min(MAX_RETRY_S, max(FIRST_RETRY_S, 2 * last))
        self._retry[model] = (self.clock() + delay, delay)
        log.warning("%s: %s; next try in %.0f s", what, exc, delay)

    async def _remove_copy(self, model: str, ready: list[str]) -> None:
        candidates = [
            (self.model_map.inflight(u, model), u) for u in ready
            if (pod := self.model_map.pod(u)) and (copy := pod.copies.get(model)) and not copy.pinned
        ]
        if len(ready) < 2 or not candidates:
            return
        _, url = min(candidates)
        pod = self.model_map.pod(url)
        try:
            await self.client.unload(url, model)
        except (WorkerError, PodUnreachable, errors.UpstreamTimeout) as exc:
            log.warning("could not remove a copy of %s from %s: %s", model, url, exc)
            return
        self.model_map.record_unloaded(url, model)
        self.metrics.removals.labels(model, pod.name if pod else url).inc()
        log.info("removed an idle extra copy of %s from %s", model, url)

    async def run_control_loop(self, interval_s: float) -> None:
        while True:
            try:
                await self.reconcile_once()
            except Exception:  # the loop must outlive one bad pass
                log.exception("control loop pass failed")
            await asyncio.sleep(interval_s)
