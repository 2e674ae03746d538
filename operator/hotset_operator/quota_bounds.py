"""Demand-driven scaling held within each namespace's ModelQuota.

Admission counts the most each model can take (``admission.usage_of``:
``memory x replicas.max``, ``replicas.max`` copies, GPUs), so the copies
demand asks for are within the quota when every accepted model is. Scaling
can still take more than that, where it runs whole pods or where admission
has not caught up:

- a **namespace pool** (``workers.pool.mode: namespace``) runs whole pods, each
  with the pod's GPUs, while admission counts a shared copy's GPUs as its
  share of a pod by bytes: copies that do not pack together need more pods,
  and so more GPUs, than their shares add up to (three copies of 60% of a pod
  are 1.8 GPUs of shares and three pods);
- an **external autoscaler** (the HPA, KEDA) may ask a namespace pool for any
  size up to its ``maxReplicas``;
- a **quota lowered** (or created) takes effect at admission's next pass; the
  pool loop may act before it.

So every pool pass holds each namespace within its quotas (``Ledger``). What
a namespace's workloads take is counted by consumer: each dedicated group
(pods: one copy, the model's memory and the pod's GPUs each), the copies its
shared models want (copies, bytes, and in a shared-mode pool their GPU share),
and its namespace pool's pods (their GPUs). A consumer may grow only into what
the quotas leave after the others, each of which counts as the larger of
what it holds now and its floor (a dedicated group's ``replicas.min``, the
copies required by min copies and held requests, the pods those need): so a
floor admission granted is never taken by another consumer's growth, and
growth beyond floors is first come, first served. A quota that binds says so
(``Cap.reason``): in the WorkerPool's ``status.reason``, and for a dedicated
group in an event on its ServedModel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Mapping, Sequence

from hotset_common import quantity
from hotset_common.spec import ModelSpec
from hotset_operator.admission import Usage
from hotset_operator.index import Quota
from hotset_operator.pool import Want

Consumer = Hashable  # ("dedicated", name), ("copies", pool), ("pods", pool)
UnitOf = Callable[[Want], Usage]  # what one copy of a want takes of its namespace's quota


@dataclass(frozen=True)
class Cap:
    """How many units a consumer may have, and why it may not have all it asked for ("": it may)."""

    allowed: int
    reason: str = ""


@dataclass
class Holding:
    held: Usage = field(default_factory=Usage)  # what it takes now (as decided this pass, or before)
    floor: Usage = field(default_factory=Usage)  # what it keeps whatever the others do


class Ledger:
    """What each namespace's workloads take of its quotas, by consumer, through one pool pass."""

    def __init__(self, quotas: Mapping[str, Sequence[Quota]]) -> None:
        self.quotas = quotas
        self._held: dict[str, dict[Consumer, Holding]] = {}

    def limited(self, namespace: str) -> bool:
        return any(q.memory is not None or q.copies is not None or q.gpus is not None
                   for q in self.quotas.get(namespace, ()))

    def hold(self, namespace: str, consumer: Consumer, held: Usage, floor: Usage | None = None) -> None:
        """Record what `consumer` takes now (and, when given, its floor)."""
        holding = self._held.setdefault(namespace, {}).setdefault(consumer, Holding())
        holding.held = held
        if floor is not None:
            holding.floor = floor

    def others(self, namespace: str, consumer: Consumer) -> Usage:
        """What the namespace's other consumers take: each its holding or its floor, the larger."""
        total = Usage()
        for key, holding in self._held.get(namespace, {}).items():
            if key != consumer:
                total = total + _larger(holding.held, holding.floor)
        return total

    def most(self, namespace: str, consumer: Consumer, unit: Usage, wanted: int, what: str) -> Cap:
        """The most of `wanted` units of `unit` each that `consumer` may have beside the others."""
        if wanted <= 0 or not self.limited(namespace):
            return Cap(max(wanted, 0))
        others = self.others(namespace, consumer)
        allowed, reason = wanted, ""
        for quota in self.quotas.get(namespace, ()):
            for resource, limit, taken, each in _resources(quota, others, unit):
                if limit is None or each <= 0:
                    continue
                fits = max(0, math.floor((limit - taken) / each + 1e-9))
                if fits < allowed:
                    allowed = fits
                    reason = (f"ModelQuota {quota.name} of namespace {namespace} allows {_amount(resource, limit)}; "
                              f"its other workloads take {_amount(resource, taken)}, which leaves room for "
                              f"{fits} {what} (of {wanted} wanted)")
        return Cap(allowed, reason)

    def trim_wants(self, wants: Sequence[Want], specs: Mapping[str, ModelSpec], consumer: Consumer,
                   unit_of: UnitOf) -> tuple[list[Want], list[str]]:
        """`wants` of a shared pool with each namespace's copies within what its quotas leave beside
        its other workloads: copies beyond their required ones go first (from the model with the most
        of them), then required ones, until they fit. Returns the wants and why any were left out.
        Records what each namespace's copies take (and their floor) as `consumer`."""
        by_namespace: dict[str, list[int]] = {}
        for position, want in enumerate(wants):
            spec = specs.get(want.model)
            if spec is not None and self.limited(spec.namespace):
                by_namespace.setdefault(spec.namespace, []).append(position)
        trimmed, reasons = list(wants), []
        for namespace, positions in sorted(by_namespace.items()):
            total = self.others(namespace, consumer) + sum(
                (times(unit_of(trimmed[p]), trimmed[p].copies) for p in positions), Usage())
            cut, why = 0, ""
            while (over := self._over(namespace, total)) and any(trimmed[p].copies for p in positions):
                victim = max(positions, key=lambda p: (_extra(trimmed[p]), trimmed[p].copies, trimmed[p].model))
                want = trimmed[victim]
                required = None if want.required is None else min(want.required, want.copies - 1)
                trimmed[victim] = replace(want, copies=want.copies - 1, required=required)
                total = total + times(unit_of(want), -1)
                cut, why = cut + 1, over
            if cut:
                reasons.append(f"{cut} wanted copies of namespace {namespace} left out: {why}")
            held = sum((times(unit_of(trimmed[p]), trimmed[p].copies) for p in positions), Usage())
            floor = sum((times(unit_of(trimmed[p]), trimmed[p].floor().copies) for p in positions), Usage())
            self.hold(namespace, consumer, held, floor)
        return [w for w in trimmed if w.copies > 0], reasons

    def _over(self, namespace: str, total: Usage) -> str:
        """Why `total` passes one of the namespace's quotas ("": it passes none)."""
        for quota in self.quotas.get(namespace, ()):
            for resource, limit, taken, _ in _resources(quota, total, Usage()):
                if limit is not None and taken > limit + 1e-9:
                    return (f"ModelQuota {quota.name} allows {_amount(resource, limit)}, and its workloads "
                            f"would take {_amount(resource, taken)} with them")
        return ""


def copy_unit(pod_budget: int, pod_gpus: int, gpus_with_copies: bool) -> UnitOf:
    """One shared copy: a copy, its bytes, and (in a shared-mode pool, whose pods belong to no
    namespace) its share of a pod's GPUs by bytes, as admission counts it. A namespace pool's
    GPUs are its pods' (``pod_unit``)."""
    def unit(want: Want) -> Usage:
        gpus = want.bytes / pod_budget * pod_gpus if gpus_with_copies and pod_budget > 0 else 0.0
        return Usage(memory=want.bytes, copies=1, gpus=gpus)
    return unit


def pod_unit(pod_gpus: int) -> Usage:
    """One pod of a namespace pool: its GPUs (its copies are counted as copies)."""
    return Usage(gpus=float(pod_gpus))


def dedicated_unit(spec: ModelSpec, pod_gpus: int) -> Usage:
    """One pod of a dedicated group: one copy of the model, its memory, the pod's GPUs."""
    return Usage(memory=spec.memory_bytes, copies=1, gpus=float(pod_gpus))


def _resources(quota: Quota, taken: Usage, unit: Usage) -> list[tuple[str, float | None, float, float]]:
    return [("memory", quota.memory, taken.memory, unit.memory), ("copies", quota.copies, taken.copies, unit.copies),
            ("gpus", quota.gpus, taken.gpus, unit.gpus)]


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{quantity.format_bytes(int(value))} of models"
    if resource == "copies":
        return f"{int(value)} copies"
    return f"{value:g} GPUs" if float(value).is_integer() else f"{value:.2f} GPUs"


def _larger(a: Usage, b: Usage) -> Usage:
    return Usage(max(a.memory, b.memory), max(a.copies, b.copies), max(a.gpus, b.gpus))


def times(unit: Usage, count: int) -> Usage:
    """`count` units of `unit`."""
    return Usage(unit.memory * count, unit.copies * count, unit.gpus * count)


def _extra(want: Want) -> int:
    """Copies of `want` beyond its required ones."""
    return want.copies - (want.copies if want.required is None else want.required)
