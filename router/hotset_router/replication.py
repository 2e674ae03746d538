"""When a hot model gets another copy, and when an extra copy goes.

The policy only counts and decides; the copy loop carries its decisions
out. Time comes from an injected clock so tests never sleep.

Demand is what the workers served, not what this router sent: the map turns
each worker's reported request counts into arrivals (``record_arrivals``),
and in-flight requests are the workers' own figures, so every router
replica sees the same demand and reaches the same decision (with R replicas
a hot model does not need R times the load to get a copy); one of them,
chosen per model (replicas.py), carries it out.

- Scale up when, over the last ``window_s``, requests per second per ready
  copy pass ``rps_per_copy`` or in-flight requests per copy pass
  ``inflight_per_copy``, up to the model's maximum copies.
- Scale down one extra copy (never below the model's minimum, never the last)
  once the model has stayed below half the thresholds for ``idle_s``.
- Churn guard: no scale-down within ``churn_guard_s`` of a scale-up of the
  same model and no scale-up within ``churn_guard_s`` of a scale-down.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

from hotset_common.spec import DEFAULT_IDLE_SECONDS


@dataclasses.dataclass(frozen=True)
class ReplicationSettings:
    rps_per_copy: float = 20.0
    inflight_per_copy: float = 4.0
    window_s: float = 5.0
    idle_s: float = 60.0
    churn_guard_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class ModelLimits:
    min_copies: int = 0
    max_copies: int = 1
    # placement: dedicated: the model's copies are its own pods, which pin it (the operator's
    # dedicated Deployment has min pods), so the router neither pre-loads nor replicates it.
    dedicated: bool = False
    # replicas.idleSeconds: a copy used this recently is still wanted (moved off a draining pod).
    idle_s: float = float(DEFAULT_IDLE_SECONDS)


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str  # "add" or "remove"
    model: str


class ReplicationPolicy:
    """Counts requests per model and decides when copies are added or removed."""

    def __init__(self, settings: ReplicationSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._window: collections.deque[tuple[float, str, float]] = collections.deque()  # (when, model, how many)
        self._in_window: dict[str, float] = {}  # model -> arrivals within the window
        self._fast: set[str] = set()  # models whose arrivals in the window pass one copy's threshold
        self._last_scale_up: dict[str, float] = {}
        self._last_scale_down: dict[str, float] = {}
        self._cool_since: dict[str, float] = {}

    def record_request(self, model: str) -> None:
        self.record_arrivals(model, 1.0)

    def record_arrivals(self, model: str, count: float) -> None:
        """`count` requests for `model` arrived now (a worker's report says it served them)."""
        self._window.append((self._clock(), model, count))
        total = self._in_window[model] = self._in_window.get(model, 0.0) + count
        if total > self._one_copy_limit():
            self._fast.add(model)

    def _one_copy_limit(self) -> float:
        return self.settings.rps_per_copy * self.settings.window_s

    def _forget_old(self) -> None:
        """Let arrivals older than the window go (each once: work in proportion to arrivals)."""
        horizon = self._clock() - self.settings.window_s
        while self._window and self._window[0][0] < horizon:
            _, model, count = self._window.popleft()
            left = self._in_window[model] - count
            if left <= 1e-9:
                del self._in_window[model]
                self._fast.discard(model)
            else:
                self._in_window[model] = left
                if left <= self._one_copy_limit():
                    self._fast.discard(model)

    def rate(self, model: str) -> float:
        """Requests per second for `model` over the window."""
        self._forget_old()
        return self._in_window.get(model, 0.0) / self.settings.window_s

    def fast_models(self) -> set[str]:
        """Models whose request rate passes one copy's threshold: the only ones hot by rate."""
        self._forget_old()
        return set(self._fast)

    def decide(self, model: str, ready_copies: int, loading_copies: int, inflight: int, limits: ModelLimits) -> Action | None:
        """One decision for one model, given what the map shows now."""
        now = self._clock()
        copies = ready_copies + loading_copies
        if ready_copies == 0 or loading_copies > 0:
            return None  # cold models are placed on demand; one change at a time
        per_copy_rate = self.rate(model) / ready_copies
        per_copy_inflight = inflight / ready_copies
        hot = per_copy_rate > self.settings.rps_per_copy or per_copy_inflight > self.settings.inflight_per_copy
        cool = (
            per_copy_rate < self.settings.rps_per_copy / 2
            and per_copy_inflight < self.settings.inflight_per_copy / 2
        )
        if not cool:
            self._cool_since.pop(model, None)
        if hot and copies < limits.max_copies and self._since(self._last_scale_down, model, now) >= self.settings.churn_guard_s:
            self._last_scale_up[model] = now
            self._cool_since.pop(model, None)
            return Action("add", model)
        if cool and copies > max(1, limits.min_copies):
            since = self._cool_since.setdefault(model, now)
            if now - since >= self.settings.idle_s and self._since(self._last_scale_up, model, now) >= self.settings.churn_guard_s:
                self._last_scale_down[model] = now
                self._cool_since.pop(model, None)
                return Action("remove", model)
        return None

    @staticmethod
    def _since(events: dict[str, float], model: str, now: float) -> float:
        return now - events[model] if model in events else float("inf")
