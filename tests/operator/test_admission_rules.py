"""Which ServedModels are accepted: quotas per namespace, names across namespaces (pure, no servers).

The same rules against the real API server and operator: test_namespaces_and_quotas.py.
"""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_operator import admission
from hotset_operator.index import ModelEntry, Quota
from hotset_testing.operator_harness import operator_config

GI = 2**30


def entry(namespace: str, name: str, created: str, gib: float = 1, max_copies: int = 1,
          placement: str = "shared") -> ModelEntry:
    spec = ModelSpec(id=name, framework="torchvision", source=f"pvc://m/{name}", memory=int(gib * GI),
                     replicas={"min": 0, "max": max_copies}, placement=placement)
    return ModelEntry(namespace=namespace, name=name, uid=f"uid-{name}", created=created, spec=spec, problems=())


CONFIG = operator_config("ops", gpus_per_pod=1, pod_memory_budget="4Gi")


def test_models_are_admitted_in_creation_order_until_the_quota_is_used():
    entries = [entry("team-a", "first", "2026-01-01T00:00:01Z", gib=2, max_copies=2),  # 4 GiB
               entry("team-a", "second", "2026-01-01T00:00:02Z", gib=3),  # 3 GiB: 7 > 6
               entry("team-a", "third", "2026-01-01T00:00:03Z", gib=1, max_copies=2),  # 2 GiB: 6 fits
               entry("team-b", "other", "2026-01-01T00:00:00Z", gib=30)]  # another namespace, no quota
    decided = admission.decide(entries, {"team-a": [Quota("team-a", "q", memory=6 * GI)]}, CONFIG)
    verdicts = {name: d.accepted for (_, name), d in decided.decisions.items()}
    assert verdicts == {"first": True, "second": False, "third": True, "other": True}
    refusal = decided.decisions[("team-a", "second")]
    assert refusal.reason == "QuotaExceeded"
    assert "ModelQuota q allows 6.0Gi" in refusal.message and "4.0Gi are taken" in refusal.message
    assert decided.usage["team-a"].memory == 6 * GI and decided.refused_in("team-a") == ["second"]


def test_copies_and_gpus_are_limited_too():
    entries = [entry("t", "shared", "1", gib=2, max_copies=2),  # 2 copies, 2 x 2/4 of a 1-GPU pod = 1 GPU
               entry("t", "own", "2", max_copies=2, placement="dedicated")]  # 2 pods x 1 GPU
    decided = admission.decide(entries, {"t": [Quota("t", "q", copies=4, gpus=2.5)]}, CONFIG)
    own = decided.decisions[("t", "own")]
    assert not own.accepted and "gpus: ModelQuota q allows 2.5 GPUs; 1.00 are taken and this model needs 2.00" in own.message
    decided = admission.decide(entries, {"t": [Quota("t", "q", copies=3)]}, CONFIG)
    assert "copies: ModelQuota q allows 3 copies" in decided.decisions[("t", "own")].message


def test_a_name_served_from_another_namespace_is_refused_and_the_earlier_keeps_it():
    entries = [entry("team-b", "sentiment", "2026-01-01T00:00:02Z"), entry("team-a", "sentiment", "2026-01-01T00:00:01Z")]
    decided = admission.decide(entries, {}, CONFIG)
    assert decided.decisions[("team-a", "sentiment")].accepted
    later = decided.decisions[("team-b", "sentiment")]
    assert (later.accepted, later.reason) == (False, "NameConflict") and "namespace 'team-a'" in later.message


def test_a_deleted_model_frees_its_quota():
    first = entry("t", "first", "1", gib=4)
    second = entry("t", "second", "2", gib=4)
    quota = {"t": [Quota("t", "q", memory=4 * GI)]}
    assert not admission.decide([first, second], quota, CONFIG).decisions[("t", "second")].accepted
    gone = ModelEntry(**{**first.__dict__, "deleting": True})
    assert admission.decide([gone, second], quota, CONFIG).decisions[("t", "second")].accepted


def test_within_one_second_the_model_already_accepted_keeps_its_name():
    """creationTimestamp has whole seconds: a newcomer created in the same second as a served model,
    from a namespace that sorts first, must not take the served model's name."""
    served = entry("team-z", "sentiment", "2026-01-01T00:00:05Z")
    served = ModelEntry(**{**served.__dict__, "incumbent": True})
    newcomer = entry("team-a", "sentiment", "2026-01-01T00:00:05Z")
    decided = admission.decide([newcomer, served], {}, CONFIG)
    assert decided.decisions[("team-z", "sentiment")].accepted
    refusal = decided.decisions[("team-a", "sentiment")]
    assert (refusal.accepted, refusal.reason) == (False, "NameConflict")
    assert "already served from namespace 'team-z'" in refusal.message


def test_continuing_the_fold_decides_as_one_pass_over_everything():
    """Models created in a burst arrive in any order within a creation second: each continues the
    last pass (judging its second again), and the decisions are those of one pass over all, the
    models already accepted keeping their place within their second as incumbents do."""
    import random

    rng = random.Random(7)
    entries = [entry(f"team-{i % 3}", f"m{i:03d}", f"2026-01-01T00:00:{i // 10:02d}Z", gib=rng.choice([1, 2, 3]))
               for i in range(120)]
    quotas = {f"team-{n}": [Quota(f"team-{n}", "q", memory=40 * GI)] for n in range(3)}
    arrival = sorted(entries, key=lambda e: (e.created, rng.random()))  # shuffled within each second
    fold = admission.Fold(quotas, CONFIG)
    ever: set = set()
    for new in arrival:
        assert fold.follows(new)
        fold.extend([new])
        now = {key for key, d in fold.result.decisions.items() if d.accepted}
        assert ever <= now  # an accepted model never loses its place to a later arrival
        ever = now
    accepted = {key for key, d in fold.result.decisions.items() if d.accepted}
    whole = admission.fold(entries, quotas, CONFIG, accepted).result
    assert fold.result.decisions == whole.decisions and fold.result.usage == whole.usage
    assert any(not d.accepted for d in whole.decisions.values())  # the quotas did refuse some
    assert fold.judged < 120 * 11  # a second judged again, never everything
    earlier = entry("team-0", "late", "2026-01-01T00:00:05Z")
    assert not fold.follows(earlier)  # created before the latest second: only a full pass may judge it


def test_owners_are_required_only_where_the_policy_or_a_quota_says_so():
    named = entry("t", "named", "1")
    named = ModelEntry(**{**named.__dict__, "spec": named.spec.model_copy(update={"owner": "ml", "oncall": "pager"})})
    anonymous = entry("t", "anonymous", "2")
    elsewhere = entry("other", "elsewhere", "3")
    entries = [named, anonymous, elsewhere]
    assert all(d.accepted for d in admission.decide(entries, {}, CONFIG).decisions.values())  # the default
    by_quota = admission.decide(entries, {"t": [Quota("t", "q", require_owner=True)]}, CONFIG).decisions
    assert {name: d.reason for (_, name), d in by_quota.items()} == {
        "named": "Valid", "anonymous": "OwnerRequired", "elsewhere": "Valid"}  # only namespace t
    assert "spec.owner and spec.oncall are required by ModelQuota q (requireOwner) of namespace t" in by_quota[("t", "anonymous")].message
    by_policy = admission.decide(entries, {}, operator_config("ops", require_owner=True)).decisions
    assert {name: d.accepted for (_, name), d in by_policy.items()} == {"named": True, "anonymous": False, "elsewhere": False}
    assert "the platform's policy (policy.requireOwner)" in by_policy[("other", "elsewhere")].message


def test_a_quota_caps_the_priority_its_namespaces_models_may_claim():
    from hotset_operator.index import quota_entry

    quota = quota_entry({"metadata": {"namespace": "t", "name": "q"}, "spec": {"maxPriority": 10}})
    assert quota.max_priority == 10
    base = entry("t", "modest", "1")
    modest = ModelEntry(**{**base.__dict__, "spec": base.spec.model_copy(update={"priority": 10})})
    base = entry("t", "greedy", "2")
    greedy = ModelEntry(**{**base.__dict__, "spec": base.spec.model_copy(update={"priority": 500})})
    base = entry("other", "elsewhere", "3")
    elsewhere = ModelEntry(**{**base.__dict__, "spec": base.spec.model_copy(update={"priority": 500})})
    decisions = admission.decide([modest, greedy, elsewhere], {"t": [quota]}, CONFIG).decisions
    assert {name: d.reason for (_, name), d in decisions.items()} == {
        "modest": "Valid", "greedy": "QuotaExceeded", "elsewhere": "Valid"}
    assert "allows priorities up to 10 (maxPriority); this model asks for 500" in decisions[("t", "greedy")].message
    assert greedy.admission_key != base.admission_key  # an edited priority is judged again



def vllm_base(namespace: str, name: str, created: str, adapter: str) -> ModelEntry:
    spec = ModelSpec(id=name, framework="vllm", task="text-generation", source=f"pvc://m/{name}", memory=GI,
                     loraAdapters=[{"name": adapter, "source": {"uri": f"pvc://m/{adapter}"}}])
    return ModelEntry(namespace=namespace, name=name, uid=f"uid-{name}", created=created, spec=spec, problems=())


def test_a_static_lora_adapters_name_is_a_model_name_no_other_model_may_take():
    """Clients send an adapter's name as the model: a static adapter (spec.loraAdapters) is refused
    when its name is taken, and a later model may not take an adapter's name, in any namespace."""
    base = vllm_base("team-a", "chat", "2026-01-01T00:00:01Z", "chat-sql")
    for later in (entry("team-b", "chat-sql", "2026-01-01T00:00:02Z"),
                  entry("team-a", "chat-sql", "2026-01-01T00:00:02Z"),  # its own namespace too
                  vllm_base("team-b", "chat2", "2026-01-01T00:00:03Z", "chat-sql")):
        decided = admission.decide([base, later], {}, CONFIG)
        assert decided.decisions[("team-a", "chat")].accepted
        refusal = decided.decisions[(later.namespace, later.name)]
        assert (refusal.accepted, refusal.reason) == (False, "NameConflict"), refusal
        assert "a LoRA adapter of model 'chat' in namespace 'team-a'" in refusal.message, refusal.message
    first = entry("team-b", "chat-sql", "2026-01-01T00:00:00Z")  # the model came first: the base is refused
    refusal = admission.decide([first, base], {}, CONFIG).decisions[("team-a", "chat")]
    assert (refusal.accepted, refusal.reason) == (False, "NameConflict")
    assert "spec.loraAdapters: 'chat-sql' is already served from namespace 'team-b'" in refusal.message
