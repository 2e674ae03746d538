"""Which ServedModels are accepted: a valid spec, a name no earlier model took, room in the quota
and within the operator's own caps (``validation.Caps``: the model store's size, dedicated pods).

One pure function over every model the operator watches, so the per-object
handler (which writes ``Accepted``) and the pool timer (which publishes the
accepted models to the workers) cannot disagree. Models are judged in
creation order: an earlier model never loses its place to a later one, and
a later one that would exceed its namespace's quota, or reuse a name served
from another namespace (clients send only the name), is refused with the
reason.

What a model counts against its namespace's quota is the most it can take:
``memory x replicas.max`` bytes, ``replicas.max`` copies, and GPUs: a
dedicated group's ``replicas.max`` pods' devices, a shared model its share of
a pool pod's devices by bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from modelplane_common import quantity
from modelplane_common.spec import ModelSpec, Placement
from modelplane_operator.config import GpuMode, OperatorConfig
from modelplane_operator.index import ModelEntry, Quota
from modelplane_operator.validation import Caps

VALID = "Valid"
INVALID_SPEC = "InvalidSpec"
QUOTA_EXCEEDED = "QuotaExceeded"
NAME_CONFLICT = "NameConflict"


@dataclass(frozen=True)
class Usage:
    """What models take (or may take) of a namespace's quota."""

    memory: int = 0
    copies: int = 0
    gpus: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.memory + other.memory, self.copies + other.copies, self.gpus + other.gpus)


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: str
    message: str


@dataclass
class Admission:
    """Every watched model's decision, and what the accepted ones use per namespace."""

    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)
    usage: dict[str, Usage] = field(default_factory=dict)

    def accepted(self, entries: Iterable[ModelEntry]) -> list[ModelEntry]:
        return [e for e in entries if (d := self.decisions.get(e.key)) is not None and d.accepted]

    def refused_in(self, namespace: str) -> list[str]:
        return sorted(name for (ns, name), d in self.decisions.items() if ns == namespace and not d.accepted)


def usage_of(spec: ModelSpec, config: OperatorConfig) -> Usage:
    """The most one model can take: its maximum copies, their bytes and their GPUs."""
    copies = spec.replicas.max
    gpus_per_pod = 0 if config.gpu_mode is GpuMode.NONE else config.gpus_per_pod + config.triton_gpus
    if spec.placement is Placement.DEDICATED:
        gpus = float(copies * gpus_per_pod)
    else:
        gpus = copies * spec.memory_bytes / config.pod_memory_budget * gpus_per_pod
    return Usage(memory=copies * spec.memory_bytes, copies=copies, gpus=gpus)


def _exceeded(quota: Quota, used: Usage, wanted: Usage) -> str | None:
    """Why `wanted` on top of `used` does not fit `quota`, or None when it does."""
    after = used + wanted
    if quota.memory is not None and after.memory > quota.memory:
        return (f"memory: ModelQuota {quota.name} allows {quantity.format_bytes(quota.memory)} of models "
                f"(memory x replicas.max); {quantity.format_bytes(used.memory)} are taken and this model needs "
                f"{quantity.format_bytes(wanted.memory)}")
    if quota.copies is not None and after.copies > quota.copies:
        return (f"copies: ModelQuota {quota.name} allows {quota.copies} copies (replicas.max); {used.copies} are "
                f"taken and this model needs {wanted.copies}")
    if quota.gpus is not None and after.gpus > quota.gpus + 1e-9:
        return (f"gpus: ModelQuota {quota.name} allows {quota.gpus:g} GPUs; {used.gpus:.2f} are taken and this "
                f"model needs {wanted.gpus:.2f}")
    return None


def decide(entries: Iterable[ModelEntry], quotas: Mapping[str, Sequence[Quota]], config: OperatorConfig) -> Admission:
    """Judge every model that is not being deleted, in creation order (then namespace, name)."""
    result = Admission()
    owners: dict[str, str] = {}  # model name -> the namespace it is served from
    # creationTimestamp has whole seconds: within one, a model already accepted keeps its place
    # (a newcomer must never take a served model's name or quota).
    alive = sorted((e for e in entries if not e.deleting),
                   key=lambda e: (e.created, not e.incumbent, e.namespace, e.name))
    caps = Caps(config, len(alive))
    for entry in alive:
        result.decisions[entry.key] = decision = _decide_one(entry, owners, quotas, result.usage, config)
        if decision.accepted and entry.spec is not None and (
                problem := caps.admit(entry.spec, store=_store_of(entry, config))) is not None:
            result.decisions[entry.key] = Decision(False, INVALID_SPEC, str(problem))
        if result.decisions[entry.key].accepted and entry.spec is not None:
            owners[entry.name] = entry.namespace
            result.usage[entry.namespace] = result.usage.get(entry.namespace, Usage()) + usage_of(entry.spec, config)
    return result


def _store_of(entry: ModelEntry, config: OperatorConfig) -> str:
    """The namespace whose model store holds `entry`: its pool's (shared) or its own (dedicated)."""
    assert entry.spec is not None
    return entry.namespace if entry.spec.placement is Placement.DEDICATED else config.pool_namespace(entry.namespace)


def _decide_one(entry: ModelEntry, owners: Mapping[str, str], quotas: Mapping[str, Sequence[Quota]],
                usage: Mapping[str, Usage], config: OperatorConfig) -> Decision:
    if entry.spec is None or entry.problems:
        return Decision(False, INVALID_SPEC, "; ".join(str(p) for p in entry.problems) or "the spec does not parse")
    if (other := owners.get(entry.name)) is not None and other != entry.namespace:
        return Decision(False, NAME_CONFLICT, (
            f"metadata.name: model {entry.name!r} is already served from namespace {other!r}; clients send only "
            "the model's name, so names are unique across the namespaces modelplane serves"))
    wanted = usage_of(entry.spec, config)
    for quota in quotas.get(entry.namespace, ()):
        if (why := _exceeded(quota, usage.get(entry.namespace, Usage()), wanted)) is not None:
            return Decision(False, QUOTA_EXCEEDED, f"namespace {entry.namespace} is over its quota of {why}")
    spec = entry.spec
    return Decision(True, VALID, f"{spec.placement.value} placement, min {spec.replicas.min} / max {spec.replicas.max} copies")
