"""How many shared-pool pods the declared minimum copies need.

A first-fit-decreasing packing of every shared model's min copies into pods of
the configured model memory budget, with each copy of one model on a different
pod. It is never below the simple bound max(ceil(total bytes / budget), largest
min); unlike that bound it is a packing that actually exists, so the router can
place every pre-provisioned copy. The configured pool minimum and maximum clamp it.
"""
from __future__ import annotations

import math
from typing import Iterable

from modelplane_common.spec import ModelSpec, Placement
from modelplane_operator.config import OperatorConfig


def lower_bound(specs: Iterable[ModelSpec], budget: int) -> int:
    """max(ceil(sum of min copies x bytes / budget), largest min): no packing can use fewer pods."""
    shared = [s for s in specs if s.placement is Placement.SHARED and s.replicas.min > 0]
    total = sum(s.replicas.min * s.memory_bytes for s in shared)
    return max(math.ceil(total / budget), max((s.replicas.min for s in shared), default=0))


def packed_pods(specs: Iterable[ModelSpec], budget: int) -> int:
    """Pods used by first-fit decreasing, copies of one model never sharing a pod."""
    copies = [(s.memory_bytes, s.id) for s in specs
              if s.placement is Placement.SHARED for _ in range(s.replicas.min)]
    pods: list[tuple[int, set[str]]] = []  # (free bytes, models on it)
    for size, model in sorted(copies, key=lambda c: (-c[0], c[1])):
        for index, (free, models) in enumerate(pods):
            if size <= free and model not in models:
                pods[index] = (free - size, models | {model})
                break
        else:
            pods.append((budget - size, {model}))
    return len(pods)


def desired_pool_size(specs: Iterable[ModelSpec], config: OperatorConfig) -> int:
    """Pool replicas: enough for every declared min copy, within the configured bounds."""
    needed = packed_pods(list(specs), config.pod_memory_budget)
    return min(max(needed, config.pool_min_pods), config.pool_max_pods)
