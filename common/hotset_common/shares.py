"""One namespace's share of a bounded resource that several namespaces use at once: the router's
request slots (router flood.py) and a worker's admission-queue places (worker admission.py).

A namespace of weight ``w`` may hold ``capacity × w / (W + 1)`` places, where ``W`` is the sum of
the weights of the namespaces holding places now, itself included. The ``+ 1`` keeps room for a
namespace that arrives next (of the default weight), so a flood never leaves a newcomer nothing;
a namespace alone may hold half. The weights are the ModelQuotas' ``servingWeight``. At least one
place, whatever the weights: a namespace is never refused outright.
"""
from __future__ import annotations

from hotset_common.spec import DEFAULT_SERVING_WEIGHT


def share_of(capacity: int, weight: float, weights_holding: float) -> int:
    """Places of `capacity` a namespace of `weight` may hold while the namespaces holding places
    (itself included) weigh `weights_holding` in all."""
    return max(1, int(capacity * weight / (weights_holding + DEFAULT_SERVING_WEIGHT)))
