"""Where a request goes: one of its model's copies, or the pod a new copy goes to.

- A model with ready copies: the less busy of two random copies (power of
  two choices on the router's in-flight counts); for an OpenAI request, the
  copy whose engine holds most of its prompt, scored with the engines' own
  queue and KV-cache figures (prefix_routing.py).
- None ready: a copy loading now (the request joins that load); else a new
  placement (``placement.place_cold``), reserved in the map so that requests
  arriving meanwhile join it.
- A canary takes its weight's share of a model's requests (``with_variant``).
- Which pods may receive a new copy is ``eligible`` (dedicated pools,
  draining pods); a realtime model goes to a pod without batch copies (and
  the reverse) whenever one can take it (``LatencyClass``).

Everything here reads the map by model: choosing a copy touches that
model's copies and nothing else; placing one reads the room of the pods
whose catalog lists the model, and their copies only when no pod has room.
"""
from __future__ import annotations

import logging
import random
from typing import Callable, Mapping

from hotset_common import errors
from hotset_common.quantity import format_bytes
from hotset_common.wire import VARIANT_HEADER
from hotset_router import placement, prefix_routing
from hotset_router.model_map import ModelMap
from hotset_router.replication import ModelLimits
from hotset_router.telemetry import RouterMetrics

log = logging.getLogger("hotset_router.routing")

LimitsLookup = Callable[[str], ModelLimits]
Eligible = Callable[[str, str], bool]  # (model, pod url) -> may a new copy go there


class Targets:
    def __init__(self, model_map: ModelMap, limits_for: Callable[[], LimitsLookup], eligible: Callable[[], Eligible],
                 metrics: RouterMetrics, placement_settings: placement.PlacementSettings, rng: random.Random,
                 retry_after_s: int, llm_routing: prefix_routing.Mode = prefix_routing.Mode.PREFIX) -> None:
        self.model_map = model_map
        self.llm_routing = llm_routing
        self.prefixes = prefix_routing.PrefixRouter()  # this router's estimate of each copy's prefix cache
        self._limits_for = limits_for  # the router's current lookups (tests replace them on the router)
        self._eligible = eligible
        self.metrics = metrics
        self.placement_settings = placement_settings
        self.rng = rng
        self.retry_after_s = retry_after_s

    def eligible(self, model: str, url: str) -> bool:
        return self._eligible()(model, url)

    # --- among copies -------------------------------------------------------------------

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
            if self._limits_for()(model).dedicated:
                raise errors.BackendUnavailable(f"no dedicated pod of {model!r} is ready yet", self.retry_after_s)
            raise errors.ModelNotFound(f"model {model!r} is not served by any worker")

    def with_variant(self, model: str, headers: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """The model (or canary version) this request goes to, and the headers that tell the worker."""
        chosen = self.choose_variant(model)
        return (model, headers) if chosen == model else (chosen, {**headers, VARIANT_HEADER: chosen})

    def still_chosen(self, model: str, chosen: str, headers: Mapping[str, str],
                     sent: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
        """(`chosen`, `sent`) while that canary version is still known; else (`model`, `headers`).
        A request picks its variant once, but its next target is asked after awaits (an attempt,
        its retry), and a status report landing meanwhile can promote or drop the canary: the
        request then goes to the model itself instead of failing as unknown (it answered 404 at
        the moment of a promotion)."""
        if chosen == model or self.model_map.is_known(chosen):
            return chosen, sent
        log.info("canary %s of %s is gone since this request chose it; sending it to %s", chosen, model, model)
        return model, headers

    def choose_variant(self, model: str) -> str:
        """`model`, or its canary version for the canary's weight in percent of the requests. A
        version no pod's catalog lists yet (or any more) is not chosen: while a rollout's reports
        arrive pod by pod, one pod can still name a canary that the others' catalogs already
        dropped (a request sent to it was a 404 during a promotion)."""
        canary = self.model_map.canary_of(model)
        if canary is None:
            return model
        variant, weight = canary
        if not self.model_map.is_known(variant):
            return model
        return variant if self.rng.random() * 100 < weight else model

    def target(self, model: str, tried: list[str], load: bool) -> tuple[str, bool] | None:
        """Where the next attempt goes: a ready copy; else a copy loading now; else a new placement
        (reserved in the map, so requests arriving meanwhile join it). (url, cold); None: nowhere left."""
        ready = [u for u in self.model_map.ready_copies(model) if u not in tried]
        if ready:
            return self.choose_copy(model, ready), False
        loading = [u for u in self.model_map.loading_copies(model) if u not in tried]
        if loading:
            return self.choose_copy(model, loading), True
        if tried and not self.others_to_try(model, set(tried)):
            return None
        self.check_known(model)
        if not load:
            capable = [p.url for p in self.model_map.pods_with_catalog(model) if p.url not in tried]
            if not capable:
                raise errors.BackendUnavailable(f"no ready worker pod can describe {model!r}", self.retry_after_s)
            return self.choose_copy(model, capable), True
        decision = self.place(model, holders=(), exclude=set(tried))
        self.model_map.reserve_load(decision.url, model, self.model_map.estimated_bytes(model))
        self.metrics.placed(model, decision.reason)
        log.info("placing %s on %s (%s; evicts %s)", model, decision.url, decision.reason, list(decision.evicts))
        return decision.url, True

    def stream_target(self, model: str, tried: list[str], prefix: str, base: str) -> tuple[str, tuple[str, ...]] | None:
        """``target`` for the OpenAI routes: (url, models this request loads there); None: nowhere left.
        A prompt prefix picks among ready copies; a LoRA adapter (`base`: its base model) with no copy
        goes where its base is loaded."""
        ready = [u for u in self.model_map.ready_copies(model) if u not in tried]
        if ready:
            return self.choose_llm_copy(model, prefix, ready, base, model), ()
        if base and not [u for u in self.model_map.loading_copies(model) if u not in tried]:
            capable = {p.url for p in self.model_map.pods_with_catalog(model) if self.eligible(model, p.url)}
            with_base = [u for u in self.model_map.ready_copies(base) if u in capable and u not in tried]
            if with_base:  # an adapter loads in moments where its base is: no placement of its own
                url = self.choose_llm_copy(model, prefix, with_base, base, base)
                self.model_map.reserve_load(url, model, self.model_map.estimated_bytes(model))
                return url, (model,)
        found = self.target(model, tried, load=True)
        if found is None:
            return None
        url, cold = found
        return url, (model,) if cold else ()

    def choose_llm_copy(self, model: str, prompt: str, urls: list[str], base: str, counted: str) -> str:
        """Among `urls`, the copy for an OpenAI request of `model` whose rendered prompt is `prompt`:
        the prefix-aware scorers (prefix_routing.py) on this router's in-flight counts of `counted`
        and the engines' own figures; uniformly at random with ``--llm-routing random``."""
        if len(urls) == 1:
            return urls[0]
        if self.llm_routing is prefix_routing.Mode.RANDOM:
            return self.rng.choice(urls)
        return self.prefixes.choose(model, prompt, urls, lambda u: self.model_map.inflight(u, counted),
                                    lambda u: self.model_map.engine_load(u, model, base), adapter=bool(base))

    def others_to_try(self, model: str, tried: set[str]) -> bool:
        return any(p.url not in tried and self.eligible(model, p.url) for p in self.model_map.pods_with_catalog(model))

    # --- a new copy's pod --------------------------------------------------------------------

    def place(self, model: str, holders: tuple[str, ...] | list[str],
              exclude: set[str] | frozenset[str] = frozenset()) -> placement.Decision:
        """The pod `model`'s next copy goes to (best fit, else cheapest eviction, else a queue; an
        extra copy of a model `holders` hold: another pod with room now); 503 when none can."""
        need = self.model_map.estimated_bytes(model)
        capable = [p.url for p in self.model_map.pods_with_catalog(model)
                   if p.url not in exclude and self.eligible(model, p.url)]
        decision = None
        excluded = self.model_map.pods_excluded_for(model)
        if excluded:  # a realtime model and a batch model share no pod: pods apart from the other side first
            apart = [url for url in capable if url not in excluded]
            decision = self._decide(model, need, apart, holders) if apart else None
        if decision is None:  # there, the worker evicts the other side's copies before it loads this one
            decision = self._decide(model, need, capable, holders)
        if decision is None:
            if not capable:
                raise errors.NoCapacity(f"no ready worker pod can take {model!r} now", self.retry_after_s)
            raise errors.NoCapacity(
                f"no worker pod has room for {model!r} ({format_bytes(need)}) even with every unpinned model evicted",
                self.retry_after_s,
            )
        return decision

    def _decide(self, model: str, need: int, urls: list[str], holders: tuple[str, ...] | list[str]) -> placement.Decision | None:
        decision = self._best_fit(model, need, urls, holders)
        if decision is None:  # no room anywhere as things are: plan evictions (reads every copy there)
            rooms = placement.rooms_from_map(self.model_map, urls)
            priority = self.model_map.priority(model)
            if holders:
                decision = placement.place_replica(model, need, rooms, holders, self.placement_settings, priority)
            else:
                decision = placement.place_cold(model, need, rooms, self.placement_settings, priority)
        return decision

    def _best_fit(self, model: str, need: int, capable: list[str], holders: tuple[str, ...] | list[str]) -> placement.Decision | None:
        """What placement would choose first, from the pods' room alone (their copies not listed)."""
        rooms = placement.rooms_from_map(self.model_map, capable, evictable=False)
        if not holders:
            return placement.best_fit(model, need, rooms, self.placement_settings)
        held = set(holders)
        busy_nodes = {r.node for r in rooms if r.url in held and r.node}
        other_nodes = [r for r in rooms if r.url not in held and (not r.node or r.node not in busy_nodes)]
        return placement.best_fit(model, need, other_nodes, self.placement_settings)
