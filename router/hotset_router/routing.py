"""The router's request side and background side, put together: one object the API and the service hold.

The work is in small modules, one job each (docs/router.md, "Request path"):

- ``targets.py``: where a request goes (a ready copy, a loading one, a new
  placement; the canary split);
- ``forwarding.py``: sending it there within its deadline, retrying once
  elsewhere (and holding it while a pod starts, pod_waiter.py);
- ``loads.py``: one load per model when something asks for a copy outside
  a request (the admin load, minimum copies), and unloads;
- ``copy_loop.py``: the background loop (minimum, hot, idle and moved
  copies), acting for the models this replica owns (replicas.py).

``Router`` keeps the names the rest of the router and its tests use; the
lookups it is built with (``limits_for``, ``eligible``, ``clock``) and its
worker ``client`` may be replaced on it, and every part sees the new one.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Iterable, Mapping

from hotset_router import placement, prefix_routing
from hotset_router.copy_loop import DEFAULT_CHUNK, CopyLoop
from hotset_router.deadlines import Deadlines
from hotset_router.forwarding import Forwarder, OnAdmitted, nothing_more
from hotset_router.loads import Loads
from hotset_router.model_map import ModelMap
from hotset_router.pod_waiter import PodWaiter
from hotset_router.replication import ReplicationPolicy
from hotset_router.status_sync import StatusSync
from hotset_router.targets import Eligible, LimitsLookup, Targets
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import UpstreamResponse, UpstreamStream, WorkerClient


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
        eligible: Eligible = lambda model, url: True,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 60.0,
        owns: Callable[[str], bool] = lambda model: True,
        changed_specs: Callable[[], Iterable[str]] = lambda: (),
        chunk: int = DEFAULT_CHUNK,
        llm_routing: prefix_routing.Mode = prefix_routing.Mode.PREFIX,
    ) -> None:
        self.model_map = model_map
        self.client = client
        self.sync = sync
        self.policy = policy
        self.limits_for = limits_for
        self.metrics = metrics
        self.eligible = eligible  # (model, pod url) -> may a new copy go there (dedicated pools)
        self.clock = clock
        self.retry_after_s = retry_after_s
        self.deadlines = Deadlines(request_timeout_s)
        self.targets = Targets(model_map, lambda: self.limits_for, lambda: self.eligible, metrics, placement_settings,
                               rng or random.Random(), retry_after_s, llm_routing)
        self.loads = Loads(model_map, lambda: self.client, sync, self.targets, metrics, self.deadlines, retry_after_s)
        self.forwarding = Forwarder(model_map, lambda: self.client, sync, self.targets, metrics, self.deadlines,
                                    retry_after_s)
        self.copy_loop = CopyLoop(model_map, self.loads, self.targets, policy, lambda: self.limits_for,
                                  lambda: self.client, metrics, lambda: self.clock, owns, changed_specs, chunk)

    # --- the request side ---------------------------------------------------------------

    async def forward(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                      load: bool = True, on_admitted: OnAdmitted = nothing_more) -> UpstreamResponse:
        return await self.forwarding.forward(model, method, path, body, headers, load, on_admitted)

    async def open_stream(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                          prefix: str = "", base: str = "", on_admitted: OnAdmitted = nothing_more) -> UpstreamStream:
        return await self.forwarding.open_stream(model, method, path, body, headers, prefix, base, on_admitted)

    @property
    def pod_waiter(self) -> PodWaiter | None:
        return self.forwarding.pod_waiter

    @pod_waiter.setter
    def pod_waiter(self, waiter: PodWaiter | None) -> None:
        self.forwarding.pod_waiter = waiter

    def check_known(self, model: str) -> None:
        self.targets.check_known(model)

    def choose_copy(self, model: str, urls: list[str]) -> str:
        return self.targets.choose_copy(model, urls)

    def place(self, model: str, holders: tuple[str, ...] | list[str],
              exclude: set[str] | frozenset[str] = frozenset()) -> placement.Decision:
        return self.targets.place(model, holders, exclude)

    def deadline(self, headers: Mapping[str, str] | None = None) -> float:
        return self.deadlines.deadline(headers)

    # --- loads outside requests -----------------------------------------------------------

    async def ensure_ready_copies(self, model: str, deadline: float | None = None) -> list[str]:
        return await self.loads.ensure_ready_copies(model, deadline)

    async def load_on(self, decision: placement.Decision, model: str, timeout_s: float | None = None) -> None:
        await self.loads.load_on(decision, model, timeout_s)

    async def unload_everywhere(self, model: str) -> list[str]:
        return await self.loads.unload_everywhere(model)

    # --- the background side --------------------------------------------------------------

    async def reconcile_once(self) -> None:
        """One pass of the copy loop."""
        await self.copy_loop.pass_once()

    async def run_control_loop(self, interval_s: float) -> None:
        await self.copy_loop.run(interval_s)

    @property
    def _background(self) -> set:
        return self.copy_loop.background
