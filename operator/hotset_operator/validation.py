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

from hotset_common import engine_args, quantity
from hotset_common import sources as locations
from hotset_common.quantity import format_bytes
from hotset_common import spec as spec_module
from hotset_common.spec import Framework, ModelSpec, Placement, SourceOptions
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig

# pydantic field names -> the ServedModel path a user writes.
_FIELD_PATHS = {"id": "metadata.name", "source": "spec.source.uri", "memory": "spec.memory",
                "memory_bytes": "spec.memory"}
_SOURCE_OPTIONS = ("source_options", "sourceOptions")


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
    if head in _SOURCE_OPTIONS:
        return ".".join(["spec.source", *(str(part) for part in loc[1:])])
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


# What a ServedModel without spec.memory is told: placement, the pool's size, quotas and the
# workers' budgets would count it as 0 bytes until a copy is measured, after it was packed.
MEMORY_REQUIRED = ("required: the model's size in bytes or as a quantity (600Mi), which placement, the pool's "
                   "size, quotas and the workers' budgets count before a copy of it is measured; without it "
                   "the model would count as 0 bytes")


def _placement_problems(spec: ModelSpec, config: OperatorConfig) -> list[Problem]:
    problems: list[Problem] = []
    if spec.memory_bytes == 0:
        problems.append(Problem("spec.memory", MEMORY_REQUIRED))
    if spec.memory_bytes > config.pod_memory_budget:
        problems.append(Problem("spec.memory", (
            f"{quantity.format_bytes(spec.memory_bytes)} does not fit a worker pod's model memory budget "
            f"of {quantity.format_bytes(config.pod_memory_budget)}")))
    if spec.placement is Placement.SHARED and spec.replicas.min > config.pool_max_pods:
        problems.append(Problem("spec.replicas.min", (
            f"{spec.replicas.min} copies need {spec.replicas.min} pods but the shared pool may grow "
            f"to {config.pool_max_pods}")))
    return problems


def _engine_arg_problems(spec: ModelSpec) -> list[Problem]:
    """``engineArgs`` of a vllm model against the pinned vLLM's own flags and the project's list
    (hotset_common.engine_args): a flag the engine does not know made it exit at start, on every pod
    that tried, and the CRD (which keeps unknown fields) cannot tell. Other frameworks start no engine:
    engineArgs there would be silently ignored, so they are refused too."""
    if not spec.engine_args:
        return []
    if spec.framework is not Framework.VLLM:
        return [Problem("spec.engineArgs", f"only framework vllm starts an engine that takes engine arguments; "
                                           f"{spec.framework.value} would ignore them")]
    if spec.base_model:
        return [Problem("spec.engineArgs", f"a LoRA adapter runs in the engine of {spec.base_model!r}: give engine "
                                           f"arguments there")]
    return [Problem(f"spec.engineArgs.{key}", message) for key, message in engine_args.problems(spec.engine_args)]


def _source_problems(spec: ModelSpec, config: OperatorConfig) -> list[Problem]:
    """The pool's source policy: which servers a pod may fetch from (``config.source_endpoints``;
    plain http only where an entry spells it out), oci:// registries included where the workers
    pull images themselves (image volumes off; with them on, the kubelet pulls)."""
    sources = [("spec.source", spec.source, spec.source_options)]
    if spec.rollout and spec.rollout.canary:
        sources.append(("spec.rollout.canary.source", spec.rollout.canary.source, spec.rollout.canary.source_options))
    sources += [(f"spec.loraAdapters[{i}].source", a.source, a.source_options) for i, a in enumerate(spec.lora_adapters)]
    return [problem for field, uri, options in sources
            if (problem := source_policy_problem(field, uri, options, config)) is not None]


def source_policy_problem(field: str, uri: str, options: SourceOptions, config: OperatorConfig) -> Problem | None:
    location = locations.parse(uri)
    if isinstance(location, locations.OciImage) and not config.image_volumes:
        return _registry_problem(field, location, config)
    # The endpoint the pool's own settings pick (the admin's choice: always allowed).
    admin = ""
    if not options.endpoint and isinstance(location, locations.BucketPrefix) and location.scheme == "s3":
        admin = config.s3_endpoint
    elif isinstance(location, locations.HubRepo):
        admin = config.hf_endpoint
    origin = locations.endpoint_of(location, options.endpoint or admin, config.hf_endpoint)
    if origin is None or (admin and origin == locations.endpoint_of(location, admin, admin)):
        return None
    if locations.endpoint_allowed(origin, config.source_endpoints):
        return None
    where = f"{field}.endpoint" if options.endpoint else f"{field}.uri"
    listed = ", ".join(config.source_endpoints) or "any https endpoint"
    why = "plain http is refused unless the policy lists it as http://host:port" if origin.startswith("http://") \
        else "it is not on the pool's source policy"
    return Problem(where, f"{origin} is not allowed: {why} (workers.sources.allowedEndpoints: {listed})")


def _registry_problem(field: str, image: locations.OciImage, config: OperatorConfig) -> Problem | None:
    """A registry the worker pulls from: over https where the policy allows it, or over plain http
    where the policy spells it out (``plain_http_registries``, which the workers are told)."""
    origin = locations.oci_origin(image, locations.plain_http_registries(config.source_endpoints))
    if locations.endpoint_allowed(origin, config.source_endpoints):
        return None
    listed = ", ".join(config.source_endpoints) or "any https endpoint"
    return Problem(f"{field}.uri", f"registry {origin} is not allowed: it is not on the pool's source policy; "
                                   f"workers pull oci:// images themselves where image volumes are off "
                                   f"(workers.sources.allowedEndpoints: {listed})")


def validate(body: dict[str, Any], config: OperatorConfig) -> Verdict:
    """Parse a ServedModel body into a ModelSpec and list everything wrong with it."""
    name = str((body.get("metadata") or {}).get("name", ""))
    try:
        spec = ModelSpec.from_served_model(body)
    except pydantic.ValidationError as error:
        return Verdict(None, (*_name_problems(name, None, config), *_schema_problems(error)))
    except (TypeError, ValueError) as error:
        return Verdict(None, (*_name_problems(name, None, config), Problem("spec", str(error))))
    return Verdict(spec, (*_name_problems(name, spec, config), *_placement_problems(spec, config),
                          *_engine_arg_problems(spec), *_source_problems(spec, config)))


class Caps:
    """The operator's bound on what all models take together, filled oldest first: the pods of
    all dedicated groups together. A model past it is refused (``Accepted=False``) instead of
    growing the cluster without bound. (The catalog has no such bound: each model is an entry
    of its own in the operator's feed, docs/architecture.md.)"""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.dedicated_pods = 0

    def admit(self, spec: ModelSpec) -> Problem | None:
        """Count `spec` in when it fits, else say why it does not."""
        dedicated = spec.replicas.min if spec.placement is Placement.DEDICATED else 0
        if dedicated and self.dedicated_pods + dedicated > self.config.max_dedicated_pods:
            return Problem("spec.replicas.min", (
                f"dedicated groups would need {self.dedicated_pods + dedicated} pods together; "
                f"the operator's cap is {self.config.max_dedicated_pods} (workers.dedicated.maxPods)"))
        self.dedicated_pods += dedicated
        return None


def over_the_caps(items: list[dict[str, Any]], config: OperatorConfig) -> dict[str, Problem]:
    """The valid ServedModels (bodies) past the operator's bounds (``Caps``), oldest first served."""
    ordered = sorted(items, key=lambda item: (item["metadata"].get("creationTimestamp") or "", item["metadata"]["name"]))
    caps = Caps(config)
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
