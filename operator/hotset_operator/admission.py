"""Which ServedModels are accepted: a valid spec, a name no earlier model took, room in the quota
and within the operator's cap on dedicated pods (``validation.Caps``).

One pure fold over every model the operator watches, in creation order: an
earlier model never loses its place to a later one, and a later one that
would exceed its namespace's quota, or reuse a name served from another
namespace (clients send only the name), is refused with the reason.

The fold is what makes admission cost follow change (``Fold``): a model
created after every model judged so far (the common case: a burst of
creations) continues the last pass in O(1); anything else (an edit, a
deletion, a quota change) is one pass over all models, never one per model.

What a model counts against its namespace's quota is the most it can take:
``memory x replicas.max`` bytes, ``replicas.max`` copies, and GPUs: a
dedicated group's ``replicas.max`` pods' devices, a shared model its share of
a pool pod's devices by bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

import pydantic

from hotset_common import quantity
from hotset_common.spec import ModelSpec, Placement
from hotset_operator import approval
from hotset_operator.config import GpuMode, OperatorConfig
from hotset_operator.index import Key, ModelEntry, Quota
from hotset_operator.validation import Caps

VALID = "Valid"
INVALID_SPEC = "InvalidSpec"
QUOTA_EXCEEDED = "QuotaExceeded"
NAME_CONFLICT = "NameConflict"
OWNER_REQUIRED = "OwnerRequired"
APPROVAL_PENDING = "ApprovalPending"


_UNIQUE = "clients send only the model's name, so names are unique across the namespaces hotset serves"


def _served(owner: str) -> str:
    """Who holds a name in the fold's owners: a namespace, or ``<namespace>/<model>`` for a static adapter."""
    namespace, _, base = owner.partition("/")
    return f"a LoRA adapter of model {base!r} in namespace {namespace!r}" if base else f"served from namespace {owner!r}"


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
    approval: approval.State = approval.State.NOT_REQUIRED
    serving: ModelSpec | None = None  # what is served instead of the spec: the approved one, a change waiting

    def spec_of(self, spec: ModelSpec | None) -> ModelSpec | None:
        """What is served of a model whose spec is `spec`."""
        return self.serving if self.serving is not None else spec


@dataclass
class Admission:
    """Every watched model's decision, and what the accepted ones use per namespace."""

    decisions: dict[Key, Decision] = field(default_factory=dict)
    usage: dict[str, Usage] = field(default_factory=dict)

    def accepted(self, entries: Iterable[ModelEntry]) -> list[ModelEntry]:
        return [e for e in entries if (d := self.decisions.get(e.key)) is not None and d.accepted]

    def refused_in(self, namespace: str) -> list[str]:
        return sorted(name for (ns, name), d in self.decisions.items() if ns == namespace and not d.accepted)

    def refused_by_namespace(self) -> dict[str, list[str]]:
        """Every namespace's refused models, in one pass (``refused_in`` for all namespaces at once)."""
        found: dict[str, list[str]] = {}
        for (namespace, name), decision in self.decisions.items():
            if not decision.accepted:
                found.setdefault(namespace, []).append(name)
        return {namespace: sorted(names) for namespace, names in found.items()}


def pod_gpus(config: OperatorConfig) -> int:
    """The GPUs one worker pod holds (its worker's and its Triton sidecar's)."""
    return 0 if config.gpu_mode is GpuMode.NONE else config.gpus_per_pod + config.triton_gpus


def usage_of(spec: ModelSpec, config: OperatorConfig) -> Usage:
    """The most one model can take: its maximum copies, their bytes and their GPUs."""
    copies = spec.replicas.max
    gpus_per_pod = pod_gpus(config)
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


Order = tuple[str, bool, str, str]  # (creationTimestamp, not incumbent, namespace, name)


def order_of(entry: ModelEntry, accepted: Collection[Key] = ()) -> Order:
    """Admission order: creation time; within one second the models already accepted first (those
    this operator accepted count too: their status may not say so yet)."""
    return entry.created, not (entry.incumbent or entry.key in accepted), entry.namespace, entry.name


class Fold:
    """Admission as a fold over models in creation order, which can be continued.

    ``extend`` judges models created after every model judged so far in O(1) each, with the
    names, quota use and dedicated pods taken by the earlier ones. creationTimestamp has whole
    seconds and creations in one second arrive in any order, so the fold keeps its state from
    before the latest second: a model of that second that sorts before others of it is judged
    with them again (O(the models of one second)). ``judged`` counts the decisions made (the
    operator's ``hotset_operator_admission_decisions_total``)."""

    def __init__(self, quotas: Mapping[str, Sequence[Quota]], config: OperatorConfig,
                 accepted: Collection[Key] = ()) -> None:
        self.quotas = quotas
        self.config = config
        self.accepted = accepted  # the models accepted before this fold (their status may not say so yet)
        self.result = Admission()
        self.judged = 0
        self.last: Order | None = None  # the order of the last model judged
        self._owners: dict[str, str] = {}  # model name -> the namespace it is served from (<ns>/<base>: an adapter)
        self._caps = Caps(config)
        self._second: list[ModelEntry] = []  # the models of the latest creation second, as judged
        self._before: tuple[dict[str, str], dict[str, Usage], int] | None = None  # the state before it

    def follows(self, entry: ModelEntry) -> bool:
        """Whether ``extend`` can take `entry`: created after everything judged, or in the latest second."""
        if self.last is None or order_of(entry) > self.last:
            return True
        return entry.created == self.last[0] and self._before is not None

    def extend(self, entries: Iterable[ModelEntry], checkpoints: bool = True) -> None:
        """Judge `entries`, in creation order, each one ``follows``."""
        for entry in entries:
            if entry.deleting:
                continue
            order = order_of(entry)
            if self.last is not None and order <= self.last:
                assert self.follows(entry), "Fold.extend: a model created before the latest second"
                self._again_with(entry)
                continue
            if checkpoints and (self.last is None or entry.created != self.last[0]):
                self.checkpoint()
            self._judge(entry, order)

    def checkpoint(self) -> None:
        """Remember the state before the latest creation second (models of it may still arrive)."""
        self._before = (dict(self._owners), dict(self.result.usage), self._caps.dedicated_pods)
        self._second = []

    def _judge(self, entry: ModelEntry, order: Order) -> None:
        self.last = order
        self.judged += 1
        self._second.append(entry)
        decision = self._decide_one(entry)
        served = decision.spec_of(entry.spec)
        if decision.accepted and served is not None and (problem := self._caps.admit(served)) is not None:
            decision = Decision(False, INVALID_SPEC, str(problem))
        self.result.decisions[entry.key] = decision
        if decision.accepted and served is not None:
            self._owners[entry.name] = entry.namespace
            for adapter in served.lora_adapters:  # names clients send too, served from the same pods
                self._owners[adapter.name] = f"{entry.namespace}/{entry.name}"
            usage = self.result.usage
            usage[entry.namespace] = usage.get(entry.namespace, Usage()) + usage_of(served, self.config)

    def _again_with(self, entry: ModelEntry) -> None:
        """Judge the latest second again, `entry` included, from the state before it."""
        assert self._before is not None
        accepted = {e.key for e in self._second if self.result.decisions[e.key].accepted}
        members = sorted(((order_of(e, accepted), e) for e in self._second if e.key != entry.key),
                         key=lambda pair: pair[0]) + [(order_of(entry), entry)]
        owners, usage, pods = self._before
        self._owners, self.result.usage, self._caps.dedicated_pods = dict(owners), dict(usage), pods
        self._second, self.last = [], None
        for order, member in sorted(members, key=lambda pair: pair[0]):
            self._judge(member, order)

    def _decide_one(self, entry: ModelEntry) -> Decision:
        if entry.spec is None or entry.problems:
            return Decision(False, INVALID_SPEC, "; ".join(str(p) for p in entry.problems) or "the spec does not parse")
        missing = self._missing_contacts(entry)
        if missing is not None and not self._served_before(entry):
            return Decision(False, OWNER_REQUIRED, missing)
        if (other := self._owners.get(entry.name)) is not None and other != entry.namespace:
            return Decision(False, NAME_CONFLICT, f"metadata.name: model {entry.name!r} is already {_served(other)}; "
                                                  f"{_UNIQUE}")
        state, serving, waiting = self._approval(entry)
        if state is approval.State.WAITING:
            return Decision(False, APPROVAL_PENDING, waiting, state)
        spec = serving if serving is not None else entry.spec
        for adapter in spec.lora_adapters:
            if (other := self._owners.get(adapter.name)) is not None:
                return Decision(False, NAME_CONFLICT, f"spec.loraAdapters: {adapter.name!r} is already {_served(other)}; "
                                                      f"{_UNIQUE}")
        wanted = usage_of(spec, self.config)
        for quota in self.quotas.get(entry.namespace, ()):
            if quota.max_priority is not None and spec.priority > quota.max_priority:
                return Decision(False, QUOTA_EXCEEDED, (
                    f"spec.priority: ModelQuota {quota.name} of namespace {entry.namespace} allows priorities up to "
                    f"{quota.max_priority} (maxPriority); this model asks for {spec.priority}"))
            if (why := _exceeded(quota, self.result.usage.get(entry.namespace, Usage()), wanted)) is not None:
                return Decision(False, QUOTA_EXCEEDED, f"namespace {entry.namespace} is over its quota of {why}")
        note = "" if missing is None else f"; served because it was accepted before the rule, but {missing}"
        if waiting:
            note += f"; {waiting}"
        return Decision(True, VALID, f"{spec.placement.value} placement, min {spec.replicas.min} / max "
                                     f"{spec.replicas.max} copies{note}", state, serving)

    def _approval(self, entry: ModelEntry) -> tuple[approval.State, ModelSpec | None, str]:
        """Where `entry` stands with approval (``approval.py``): its state, the spec served instead of
        its own while a change waits, and what waits for approval ("" when nothing does)."""
        assert entry.spec is not None
        requiring = [q.name for q in self.quotas.get(entry.namespace, ()) if q.require_approval]
        if requiring:
            by = f"ModelQuota {requiring[0]} (requireApproval) of namespace {entry.namespace}"
        elif self.config.require_approval:
            by = "the platform's policy (policy.requireApproval)"
        else:
            return approval.State.NOT_REQUIRED, None, ""
        approved = entry.approved
        if approved is not None and approval.same(approved.fields, entry.gated):
            return approval.State.APPROVED, None, ""
        how = approval.how_to_approve(entry.namespace, entry.name, entry.generation)
        if approved is not None:
            try:
                serving = approval.serving_spec(entry.spec, approved)
            except pydantic.ValidationError:  # an approval of an older schema: nothing is served as it was
                serving = None
            if serving is not None:
                changed = ", ".join(approval.changed_fields(approved.fields, entry.gated))
                who = f" by {approved.by}" if approved.by else ""
                return approval.State.PENDING, serving, (
                    f"serving generation {approved.generation} as approved{who}; generation {entry.generation} "
                    f"changes {changed}, which {by} requires approval for: {how}")
        if self._served_before(entry):
            return approval.State.BASELINE, None, ""
        return approval.State.WAITING, None, (
            f"generation {entry.generation} is not served until it is approved, which {by} requires: {how}")

    def _served_before(self, entry: ModelEntry) -> bool:
        """Whether `entry` was accepted already: a rule about contacts that arrives later (a new
        policy, a quota's requireOwner) never stops a model that serves; its status says what to add."""
        return entry.incumbent or entry.key in self.accepted

    def _missing_contacts(self, entry: ModelEntry) -> str | None:
        """Why `entry` may not be served without naming whom to call, or None: the chart's
        policy.requireOwner, or a ModelQuota of its namespace with requireOwner."""
        assert entry.spec is not None
        missing = [name for name, value in (("spec.owner", entry.spec.owner), ("spec.oncall", entry.spec.oncall))
                   if not value.strip()]
        if not missing:
            return None
        requiring = [q.name for q in self.quotas.get(entry.namespace, ()) if q.require_owner]
        if requiring:
            by = f"ModelQuota {requiring[0]} (requireOwner) of namespace {entry.namespace}"
        elif self.config.require_owner:
            by = "the platform's policy (policy.requireOwner)"
        else:
            return None
        return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required by {by}: every model "
                "names its owning team and whom to page when it breaks")


def fold(entries: Iterable[ModelEntry], quotas: Mapping[str, Sequence[Quota]], config: OperatorConfig,
         accepted: Collection[Key] = ()) -> Fold:
    """A fold over every model that is not being deleted, ready to be continued. `accepted`: models
    accepted before (they keep their place within their creation second, as incumbents do)."""
    result = Fold(quotas, config, accepted)
    alive = {e.key: e for e in entries if not e.deleting}  # one per name (a name reused: the newest)
    ordered = sorted(alive.values(), key=lambda e: order_of(e, accepted))
    latest = next((i for i, e in enumerate(ordered) if e.created == ordered[-1].created), 0)
    for entry in ordered[:latest]:
        result._judge(entry, order_of(entry, accepted))
    result.checkpoint()
    for entry in ordered[latest:]:
        result._judge(entry, order_of(entry, accepted))
    return result


def decide(entries: Iterable[ModelEntry], quotas: Mapping[str, Sequence[Quota]], config: OperatorConfig) -> Admission:
    """Judge every model that is not being deleted, in creation order (then namespace, name)."""
    return fold(entries, quotas, config).result
