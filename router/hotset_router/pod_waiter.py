"""Wait, don't refuse, while pods start: a request for a model no ready pod can serve waits for one.

In every mode a request can find no ready pod for its model while one is on
its way: a worker of a static ``--workers`` list still starting (it answers,
it is not ready yet: its pinned models are loading), a rolling pool's new
pods, or a dedicated group with ``replicas.min: 0`` (or a pool allowed to
shrink to no pods) scaled to zero after its idle time. Instead of answering
503 at once (a load test started right after the stack came up failed 600 of
600 requests in a second), the router holds the request until the status
sync brings a ready pod that can serve it (the normal path then forwards
it, a cold load there if need be), or answers 503 with Retry-After once the
request's deadline passes. A model waits when a ServedModel (or the
router's ``--model-store``) declares it or some pod's catalog lists it; a
model nobody knows is answered at once (404). In cluster mode the router
also asks the operator for a pod: it annotates the model's ServedModel with
``hotset.io/wanted-at``, the one write the router makes. Nothing polls on
the request path: the request waits for the sync's next pass. ``wait``
returns how long it held the request, and the 503 at its deadline says so
too (``wire.POD_WAIT_TIMING`` in Server-Timing): a client can tell a slow
answer that waited for a pod from one that was slow on the pod.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Protocol

from hotset_common import errors, wire
from hotset_router.discovery import Discovery
from hotset_router.model_map import ModelMap
from hotset_router.status_sync import StatusSync
from hotset_router.telemetry import RouterMetrics

log = logging.getLogger(__name__)
MARK_EVERY_S = 1.0  # re-annotate while requests keep waiting: the operator sees the demand is still live


class MarksWanted(Protocol):
    def mark_wanted(self, model: str, value: str) -> None: ...


class PodWaiter:
    def __init__(self, model_map: ModelMap, sync: StatusSync, discovery: Discovery, marker: MarksWanted | None,
                 eligible: Callable[[str, str], bool], metrics: RouterMetrics, retry_after_s: int = 5,
                 wall: Callable[[], float] = time.time) -> None:
        self.model_map = model_map
        self.sync = sync
        self.discovery = discovery
        self.marker = marker
        self.eligible = eligible
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.wall = wall
        self._marked: dict[str, float] = {}  # model -> event-loop time of its last annotation
        self._marking: set[asyncio.Task[None]] = set()

    def can_serve(self, model: str) -> bool:
        """A ready copy, or a ready pod of the model's pool whose catalog lists it."""
        if self.model_map.ready_copies(model):
            return True
        return any(self.eligible(model, pod.url) for pod in self.model_map.pods_with_catalog(model))

    async def wait(self, model: str, deadline: float) -> float | None:
        """Hold until a pod can serve `model`, and return the seconds held; None at once when one can, or
        when nothing declares or lists the model (the normal path answers then). Past `deadline`
        (event-loop time): 503 + Retry-After, with the time held in its Server-Timing."""
        if self.can_serve(model):
            return None
        declared = self.discovery.spec_of(model) is not None
        if not declared and not self.model_map.is_known(model):
            return None
        asks = declared and self.marker is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        log.info("no ready pod can serve %s: %sholding the request (%.0fs left)", model,
                 "asking for one and " if asks else "", deadline - started)
        while not self.can_serve(model):
            left = deadline - loop.time()
            if left <= 0:
                self.metrics.held(model, "deadline")
                how = "one was asked for" if asks else "the request waited"
                held = loop.time() - started
                expired = errors.BackendUnavailable(
                    f"no pod of {model!r} is ready yet: {how} {held:.1f}s ago; the request's "
                    "deadline passed first", self.retry_after_s)
                expired.headers[wire.SERVER_TIMING_HEADER] = wire.POD_WAIT_TIMING.entry(held)
                raise expired
            if asks:
                self._mark(model, loop.time())
            try:
                await asyncio.wait_for(self.sync.changed(), min(left, MARK_EVERY_S))
            except (asyncio.TimeoutError, TimeoutError):
                pass
        held = loop.time() - started
        self.metrics.held(model, "served", held)
        return held

    def _mark(self, model: str, now: float) -> None:
        """Annotate the model's ServedModel, at most every MARK_EVERY_S, off the event loop."""
        if now - self._marked.get(model, float("-inf")) < MARK_EVERY_S:
            return
        self._marked[model] = now
        task = asyncio.ensure_future(asyncio.to_thread(self._annotate, model, f"{self.wall():.3f}"))
        self._marking.add(task)
        task.add_done_callback(self._marking.discard)

    def _annotate(self, model: str, value: str) -> None:
        assert self.marker is not None
        try:
            self.marker.mark_wanted(model, value)
        except Exception as exc:  # the request keeps waiting; the next mark tries again
            log.warning("could not ask for a pod of %s: %s", model, exc)
