"""Which models have Prometheus series of their own: at most a number of them, by recent use.

A series per model and label value is what makes "which model is slow"
answerable, and what grows without bound with the catalog: a 14-bucket
latency histogram alone is 17 series per model (buckets, sum, count,
created), and a worker exports a dozen per-model families. So the router
and the worker bound them the same way: at most ``max_models`` models have
series of their own at a time. A model gets them with its first event (a
request, a load) while there is room, keeps them while it has events, and
loses every series that names it after ``idle_s`` without one, which makes
room for the next. Events of models beyond the limit are counted together
under ``model="_other"``; names no worker knows under ``model="_unknown"``.
Sums over ``model`` stay exact. A slow model in use keeps its own series as
long as the limit covers the models in use (raise it when the models-with-
series gauge sits at it).
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

OTHER_MODELS = "_other"  # the aggregate of models without series of their own
UNKNOWN_MODEL = "_unknown"  # names no worker's catalog lists (clients must not mint series)
DEFAULT_MAX_MODEL_SERIES = 500
DEFAULT_SERIES_IDLE_S = 300.0


class ModelSeries:
    """Which models have series of their own (see the module docstring), and the series each one has.

    `on_change(model, has_series)` is told when a model gets its series and when it loses them
    (after they are removed), so a caller that keeps absolute values (gauges) can move them
    between the model's own series and the aggregate's."""

    def __init__(self, max_models: int = DEFAULT_MAX_MODEL_SERIES, idle_s: float = DEFAULT_SERIES_IDLE_S,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, bool], None] = lambda model, has_series: None) -> None:
        self.max_models = max_models
        self.idle_s = idle_s
        self.clock = clock
        self.on_change = on_change
        self._last: collections.OrderedDict[str, float] = collections.OrderedDict()  # least recently used first
        self._series: dict[str, set[tuple[Any, tuple[str, ...]]]] = {}

    def label(self, model: str) -> str:
        """`model`'s label: itself while it has series of its own (it counts as used now), else OTHER_MODELS."""
        now = self.clock()
        if model in self._last:
            self._last[model] = now
            self._last.move_to_end(model)
            return model
        self.expire(now)
        if len(self._last) < self.max_models:
            self._last[model] = now
            self.on_change(model, True)
            return model
        return OTHER_MODELS

    def has_series(self, model: str) -> bool:
        return model in self._last

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric`'s child for `labels` (the model's label first), remembered for its model's expiry."""
        if labels[0] in self._last:
            self._series.setdefault(labels[0], set()).add((metric, labels))
        return metric.labels(*labels)

    def forget(self, metric: Any, *labels: str) -> None:
        """Remove one child of a model that keeps its other series (a gauge of something that went)."""
        self._series.get(labels[0], set()).discard((metric, labels))
        try:
            metric.remove(*labels)
        except KeyError:
            pass

    def expire(self, now: float | None = None) -> None:
        """Drop every series of the models without an event for `idle_s`."""
        now = self.clock() if now is None else now
        while self._last:
            model, used = next(iter(self._last.items()))
            if now - used < self.idle_s:
                return
            del self._last[model]
            for metric, labels in self._series.pop(model, ()):
                try:
                    metric.remove(*labels)
                except KeyError:
                    pass
            self.on_change(model, False)

    def __len__(self) -> int:
        return len(self._last)
