"""Checks on a ServedModel that its OpenAPI schema cannot express.

The API server already enforces types, enums, bounds and the source pattern.
What needs the operator's settings (does the model fit a pod? can the pool
hold min copies?) or cross-field logic is checked here; each problem names the
field so `kubectl describe` tells the user what to fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic

from modelplane_common import quantity
from modelplane_common.quantity import format_bytes
from modelplane_common import spec as spec_module
from modelplane_common.spec import ModelSpec, Placement
from modelplane_operator import workloads
from modelplane_operator.config import OperatorConfig

# pydantic field names -> the ServedModel path a user writes.
_FIELD_PATHS = {"id": "metadata.name", "source": "spec.source.uri", "memory": "spec.memory",
                "memory_bytes": "spec.memory"}


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    spec: ModelSpec | None
    problems: tuple[Problem, ...]

    @property
    def accepted(self) -> bool:
        return not self.problems

    def message(self) -> str:
        return "; ".join(str(p) for p in self.problems)


def _field_path(loc: tuple[Any, ...]) -> str:
    head = str(loc[0]) if loc else "spec"
    if head in _FIELD_PATHS:
        return _FIELD_PATHS[head]
    return ".".join(["spec", *(str(part) for part in loc)])


def _schema_problems(error: pydantic.ValidationError) -> tuple[Problem, ...]:
    problems = []
    for item in error.errors():
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(Problem(_field_path(tuple(item["loc"])), message))
    return tuple(problems)


def _name_problems(name: str, spec: ModelSpec | None, config: OperatorConfig) -> list[Problem]:
    """Names that would reach another pool's objects: reserved words (the CRD's CEL rule refuses
    them too, but not for objects created before it), and a dedicated group named like the pool."""
    problems: list[Problem] = []
    reserved = spec_module.reserved_name_problem(name)
    if reserved is not None:
        problems.append(Problem("metadata.name", reserved))
    if spec is not None and spec.placement is Placement.DEDICATED and workloads.dedicated_name(name) == config.pool_name:
        problems.append(Problem("metadata.name", (
            f"its dedicated Deployment would be {workloads.dedicated_name(name)!r}, the shared pool's own name; "
            "choose another name")))
    return problems


def _placement_problems(spec: ModelSpec, config: OperatorConfig) -> list[Problem]:
    problems: list[Problem] = []
    if spec.memory_bytes > config.pod_memory_budget:
        problems.append(Problem("spec.memory", (
            f"{quantity.format_bytes(spec.memory_bytes)} does not fit a worker pod's model memory budget "
            f"of {quantity.format_bytes(config.pod_memory_budget)}")))
    if spec.placement is Placement.SHARED and spec.replicas.min > config.pool_max_pods:
        problems.append(Problem("spec.replicas.min", (
            f"{spec.replicas.min} copies need {spec.replicas.min} pods but the shared pool may grow "
            f"to {config.pool_max_pods}")))
    return problems


def validate(body: dict[str, Any], config: OperatorConfig) -> Verdict:
    """Parse a ServedModel body into a ModelSpec and list everything wrong with it."""
    name = str((body.get("metadata") or {}).get("name", ""))
    try:
        spec = ModelSpec.from_served_model(body)
    except pydantic.ValidationError as error:
        return Verdict(None, (*_name_problems(name, None, config), *_schema_problems(error)))
    except (TypeError, ValueError) as error:
        return Verdict(None, (*_name_problems(name, None, config), Problem("spec", str(error))))
    return Verdict(spec, (*_name_problems(name, spec, config), *_placement_problems(spec, config)))


class Caps:
    """The operator's bounds on what all models take together, filled oldest first: the
    model-store ConfigMap (one object for every model, limited to 1 MiB by etcd) and the pods of
    all dedicated groups together. A model past either is refused (``Accepted=False``) instead of
    breaking the store for every model or growing the cluster without bound."""

    def __init__(self, config: OperatorConfig, count: int) -> None:
        self.config = config
        self.count = count  # ServedModels in all: named in the message of a full store
        self.store_bytes: dict[str, int] = {}  # per model store (one ConfigMap per namespace)
        self.dedicated_pods = 0

    def admit(self, spec: ModelSpec, store: str = "") -> Problem | None:
        """Count `spec` in when it fits (into the model store `store`), else say why it does not."""
        size = workloads.store_entry_bytes(spec)
        used = self.store_bytes.get(store, 64)
        if used + size > self.config.max_store_bytes:
            return Problem("metadata.name", (
                f"the model store is full: {self.count} ServedModels need more than its "
                f"{quantity.format_bytes(self.config.max_store_bytes)} (one ConfigMap); delete unused ones"))
        dedicated = spec.replicas.min if spec.placement is Placement.DEDICATED else 0
        if dedicated and self.dedicated_pods + dedicated > self.config.max_dedicated_pods:
            return Problem("spec.replicas.min", (
                f"dedicated groups would need {self.dedicated_pods + dedicated} pods together; "
                f"the operator's cap is {self.config.max_dedicated_pods} (workers.dedicated.maxPods)"))
        self.store_bytes[store] = used + size
        self.dedicated_pods += dedicated
        return None


def over_the_caps(items: list[dict[str, Any]], config: OperatorConfig) -> dict[str, Problem]:
    """The valid ServedModels (bodies) past the operator's bounds (``Caps``), oldest first served."""
    ordered = sorted(items, key=lambda item: (item["metadata"].get("creationTimestamp") or "", item["metadata"]["name"]))
    caps = Caps(config, len(ordered))
    problems: dict[str, Problem] = {}
    for item in ordered:
        verdict = validate(item, config)
        if verdict.spec is not None and verdict.accepted and (problem := caps.admit(verdict.spec)) is not None:
            problems[verdict.spec.id] = problem
    return problems


def rollout_fit(spec: ModelSpec, config: OperatorConfig) -> tuple[bool, str, str] | None:
    """With a canary: (fits, reason, message) for both versions held at once on one pod, the memory
    peak of serving two versions side by side (and of a dedicated pod taking the canary over). None
    without a canary."""
    canary = spec.canary_variant()
    if canary is None:
        return None
    both = spec.memory_bytes + canary.memory_bytes
    budget = config.pod_memory_budget
    versions = (f"versions {spec.version} ({format_bytes(spec.memory_bytes)}) and {canary.version} "
                f"({format_bytes(canary.memory_bytes)}) need {format_bytes(both)} together")
    if both <= budget:
        return True, "BothVersionsFit", f"{versions}, within a pod's memory budget of {format_bytes(budget)}"
    return False, "NoRoomForBothVersions", (
        f"{versions}, more than a pod's memory budget of {format_bytes(budget)}: the two versions are "
        "placed on different pods where the pool has them, and a pod never holds both (a dedicated "
        "group's pods swap versions with a restart)")
