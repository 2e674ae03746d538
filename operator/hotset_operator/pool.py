"""How many shared-pool pods a set of wanted copies needs.

A first-fit-decreasing packing of the wanted copies into pods of the
configured model memory budget, with each copy of one model on a different
pod. It is never below the simple bound max(ceil(total bytes / budget),
most copies of one model); unlike that bound it is a packing that actually
exists, so the router can place every copy. The wanted copies are the
declared minimum copies (``min_copies``) and, when the pool autoscales, what
the workers' reports show is in use (``demand.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from hotset_common.spec import ModelSpec, Placement
from hotset_operator.config import OperatorConfig


@dataclass(frozen=True)
class Want:
    """Copies of one model the pool should hold, each of `bytes`, and why."""

    model: str
    bytes: int
    copies: int
    why: str = "min"
    required: int | None = None  # of these, copies needed whoever scales (min copies, a request held for a pod)

    def floor(self) -> "Want":
        """Only the required copies (all of them when not said otherwise)."""
        return Want(self.model, self.bytes, self.copies if self.required is None else self.required, self.why)


def min_copies(specs: Iterable[ModelSpec]) -> list[Want]:
    """The declared minimum copies of the shared models."""
    return [Want(s.id, s.memory_bytes, s.replicas.min) for s in specs
            if s.placement is Placement.SHARED and s.replicas.min > 0]


def bound(wants: Iterable[Want], budget: int) -> int:
    """max(ceil(sum of copies x bytes / budget), most copies of one model): no packing can use fewer pods."""
    wants = [w for w in wants if w.copies > 0]
    total = sum(w.copies * w.bytes for w in wants)
    return max(math.ceil(total / budget), max((w.copies for w in wants), default=0))


def pack(wants: Iterable[Want], budget: int) -> int:
    """Pods used by first-fit decreasing, copies of one model never sharing a pod."""
    copies = [(w.bytes, w.model) for w in wants for _ in range(w.copies)]
    pods: list[tuple[int, set[str]]] = []  # (free bytes, models on it)
    for size, model in sorted(copies, key=lambda c: (-c[0], c[1])):
        for index, (free, models) in enumerate(pods):
            if size <= free and model not in models:
                pods[index] = (free - size, models | {model})
                break
        else:
            pods.append((budget - size, {model}))
    return len(pods)


def lower_bound(specs: Iterable[ModelSpec], budget: int) -> int:
    """The bound for the declared minimum copies."""
    return bound(min_copies(specs), budget)


def packed_pods(specs: Iterable[ModelSpec], budget: int) -> int:
    """The packing of the declared minimum copies."""
    return pack(min_copies(specs), budget)


def desired_pool_size(specs: Iterable[ModelSpec], config: OperatorConfig) -> int:
    """Pool replicas: enough for every declared min copy, within the configured bounds."""
    needed = packed_pods(list(specs), config.pod_memory_budget)
    return min(max(needed, config.pool_min_pods), config.pool_max_pods)
