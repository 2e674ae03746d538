"""Wires the router's parts together and runs its background loops (status sync, copy loop, loop-lag watch).

Everything is built from explicit settings (no environment, no globals), so
tests and benchmarks can build a router in-process with their own settings.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
from typing import Mapping

from hotset_common import errors, heap, labels
from hotset_common.spec import Placement
from hotset_common.worker_identity import BearerToken, PodProofs
from hotset_router import placement, prefix_routing
from hotset_router.callers import CallerSettings, Callers, Reviews
from hotset_router.rates import NamespaceRates
from hotset_router.discovery import Discovery
from hotset_router.model_map import ModelMap
from hotset_router.pod_waiter import PodWaiter
from hotset_router.replicas import Replicas
from hotset_router.replication import ModelLimits, ReplicationPolicy, ReplicationSettings
from hotset_router.routing import Router
from hotset_router.status_sync import DEFAULT_PAGE, StatusSync
from hotset_router.telemetry import DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S, RouterMetrics, watch_loop_lag
from hotset_router.upstream import WorkerClient


@dataclasses.dataclass(frozen=True)
class RouterSettings:
    sync_interval_s: float = 1.0
    control_interval_s: float = 1.0
    request_timeout_s: float = 60.0
    load_timeout_s: float = 300.0
    # What the router presents to workers: its projected ServiceAccount token (cluster mode), a local
    # stack's fixed token, or nothing.
    worker_credential: BearerToken = dataclasses.field(default_factory=BearerToken)
    default_max_copies: int = 1
    retry_after_s: int = 5
    replication: ReplicationSettings = ReplicationSettings()
    placement: placement.PlacementSettings = placement.PlacementSettings()
    seed: int | None = None
    router_id: str = ""  # this replica's name to the workers (its pod name in cluster mode); "": a random one
    status_page: int = DEFAULT_PAGE  # entries per status answer
    max_model_series: int = DEFAULT_MAX_MODEL_SERIES  # models with per-model metric series at once
    model_series_idle_s: float = DEFAULT_SERIES_IDLE_S  # a model's series go after this long without a request
    callers: CallerSettings = CallerSettings()  # who may call (callers.py); default: everyone
    llm_routing: prefix_routing.Mode = prefix_routing.Mode.PREFIX  # the choice among an LLM's ready copies
    # Once the first status pass has read every pod (before serving: the app's start-up), keep what
    # exists then out of the garbage collector's full passes (hotset_common.heap). The command does;
    # in-process tests do not (they would freeze each other's objects).
    freeze_heap: bool = False


class RouterService:
    """The map, the worker client, the sync and control loops, and the router itself."""

    def __init__(self, discovery: Discovery, settings: RouterSettings = RouterSettings(),
                 reviews: Reviews | None = None, proofs: PodProofs | None = None) -> None:
        """`reviews`: who answers caller checks (the API server), needed when `settings.callers` checks them;
        `proofs`: worker pods must prove which pod they are before they get anything (status_sync.py)."""
        self.discovery = discovery
        self.settings = settings
        self.router_id = settings.router_id or f"router-{secrets.token_hex(4)}"
        self.policy = ReplicationPolicy(settings.replication)
        # Demand is what the workers report they served, so every replica counts the same (replication.py).
        self.model_map = ModelMap(on_arrivals=self.policy.record_arrivals)
        self.replicas = Replicas(self.router_id, self.model_map.router_ids)
        self.metrics = RouterMetrics(settings.max_model_series, settings.model_series_idle_s)
        self.client = WorkerClient(settings.request_timeout_s, settings.load_timeout_s,
                                   credential=settings.worker_credential, router_id=self.router_id)
        self.sync = StatusSync(self.model_map, self.client, discovery, settings.sync_interval_s, page=settings.status_page,
                               proofs=proofs)
        self.router = Router(
            self.model_map,
            self.client,
            self.sync,
            self.policy,
            self.limits_for,
            self.metrics,
            settings.placement,
            random.Random(settings.seed),
            settings.retry_after_s,
            self.eligible,
            request_timeout_s=settings.request_timeout_s,
            owns=self.replicas.owns,
            changed_specs=getattr(discovery, "take_changed_specs", set),  # a discovery without it: specs fixed
            llm_routing=settings.llm_routing,
        )
        self.callers = Callers(reviews, getattr(discovery, "namespace_of", lambda model: None), settings.callers,
                               on_review=self.metrics.reviewed)
        self.router.forwarding.callers = self.callers
        rate_of = getattr(discovery, "rate_of", None)
        if rate_of is not None:
            self.router.forwarding.rates = NamespaceRates(rate_of, lambda: len(self.replicas.live()))
        weight_of = getattr(discovery, "weight_of", None)
        if weight_of is not None:
            self.router.forwarding.weight_of = weight_of
        # Every mode waits while pods start; cluster mode can also ask the operator for one.
        marker = discovery if hasattr(discovery, "mark_wanted") else None
        self.router.pod_waiter = PodWaiter(self.model_map, self.sync, discovery, marker,  # type: ignore[arg-type]
                                           self.eligible, self.metrics, settings.retry_after_s)
        self._tasks: list[asyncio.Task[None]] = []

    def eligible(self, model: str, url: str) -> bool:
        """Whether `url` may receive a new copy of `model`: dedicated groups hold only their own model,
        and a pod the operator is draining gets nothing new."""
        if self.discovery.draining(url):
            return False
        pool = self.discovery.pool_of(url)
        if not pool:
            return True
        spec = self.discovery.spec_of(model)
        dedicated = spec is not None and spec.placement == Placement.DEDICATED
        wanted = labels.dedicated_pool(model) if dedicated else labels.SHARED_POOL
        return pool == wanted

    async def model_ready(self, name: str, version: str | None, headers: Mapping[str, str]) -> bool:
        """OIP's model readiness (HTTP and gRPC alike): whether `name` has a ready copy; 404 for a
        model no worker serves, or a version it does not have (as a worker answers), and the caller
        checks of an inference (callers.py). Never loads."""
        await self.callers.check(headers, name)
        self.router.check_known(name)
        known = self.sync.catalog.metadata(name).version
        if version not in (None, "", known) and known:
            raise errors.ModelNotFound(f"model {name!r} has no version {version!r}; available: {known!r}")
        return bool(self.model_map.ready_copies(name))

    def grpc_port(self, url: str) -> int | None:
        """Where the worker at `url` serves OIP v2 over gRPC, as its last report said; None: nowhere."""
        pod = self.model_map.pod(url)
        return pod.grpc_port if pod is not None else None

    def limits_for(self, model: str) -> ModelLimits:
        """A model's min/max copies from its spec; models without one get the router's default."""
        spec = self.discovery.spec_of(model)
        if spec is None:
            return ModelLimits(0, self.settings.default_max_copies)
        return ModelLimits(spec.replicas.min, spec.replicas.max, dedicated=spec.placement == Placement.DEDICATED,
                           idle_s=spec.replicas.idle_seconds)

    async def start(self) -> None:
        await self.sync.refresh_all()
        if self.settings.freeze_heap:
            heap.freeze_start_up()
        self._tasks = [
            asyncio.ensure_future(self.sync.run()),
            asyncio.ensure_future(self.router.run_control_loop(self.settings.control_interval_s)),
            asyncio.ensure_future(watch_loop_lag(self.metrics.loop_lag)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
