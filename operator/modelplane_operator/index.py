"""What the operator keeps in memory about every ServedModel and ModelQuota it watches.

kopf indexes (``@kopf.index``) hold one small, immutable entry per object,
updated on each of its events, so the pool timer and the per-object handlers
read every model without listing or re-validating them: the cross-object
state the pool, the model stores and the quotas need.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from modelplane_common import labels, quantity
from modelplane_common.spec import ModelSpec
from modelplane_operator import validation
from modelplane_operator.config import OperatorConfig


@dataclass(frozen=True)
class ModelEntry:
    """One ServedModel as the pool and admission need it."""

    namespace: str
    name: str
    uid: str
    created: str  # creationTimestamp: admission goes in creation order
    spec: ModelSpec | None  # None: the spec does not parse
    problems: tuple[validation.Problem, ...]  # what validation found (empty: valid)
    wanted_at: float = 0.0  # unix seconds a request last waited for a pod of it (the router's annotation)
    deleting: bool = False
    incumbent: bool = False  # Accepted=True now: wins a tie on creationTimestamp (whole seconds)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


@dataclass(frozen=True)
class Quota:
    """A namespace's allowance (ModelQuota.spec); None: no limit on that resource."""

    namespace: str
    name: str
    memory: int | None = None
    copies: int | None = None
    gpus: float | None = None


def _wanted_at(annotations: Mapping[str, str]) -> float:
    try:
        return float(annotations.get(labels.WANTED_AT, 0) or 0)
    except ValueError:
        return 0.0


def _accepted_now(body: Mapping[str, Any]) -> bool:
    found = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Accepted" and c.get("status") == "True" for c in found)


def model_entry(body: Mapping[str, Any], config: OperatorConfig) -> ModelEntry:
    """The index entry of one ServedModel body (validation needs the operator's settings)."""
    meta = body.get("metadata") or {}
    verdict = validation.validate(dict(body), config)
    return ModelEntry(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
        created=str(meta.get("creationTimestamp", "")), spec=verdict.spec, problems=verdict.problems,
        wanted_at=_wanted_at(meta.get("annotations") or {}), deleting=bool(meta.get("deletionTimestamp")),
        incumbent=_accepted_now(body))


def quota_entry(body: Mapping[str, Any]) -> Quota:
    """A ModelQuota body's limits (the CRD's schema has checked their shapes)."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    memory = spec.get("memory")
    return Quota(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                 memory=None if memory is None else quantity.parse_bytes(memory),
                 copies=None if spec.get("copies") is None else int(spec["copies"]),
                 gpus=None if spec.get("gpus") is None else float(spec["gpus"]))


def entries(index: Mapping[Any, Iterable[ModelEntry]]) -> list[ModelEntry]:
    """Every entry of a kopf index keyed by namespace, in a stable order."""
    found = [entry for key in list(index) for entry in index.get(key, ())]
    return sorted(found, key=lambda e: (e.namespace, e.name))


def quotas(index: Mapping[Any, Iterable[Quota]]) -> dict[str, list[Quota]]:
    return {namespace: sorted(index.get(namespace, ()), key=lambda q: q.name) for namespace in list(index)}
