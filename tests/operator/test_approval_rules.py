"""Approval as admission and the status decide it (pure, no servers): what waits, what is served
meanwhile, what a granted approval records and when its change took effect.

The same rules against a real API server, its RBAC and the chart's ValidatingAdmissionPolicy:
test_approvals.py.
"""
from __future__ import annotations

import dataclasses

from hotset_common.spec import ModelSpec
from hotset_operator import admission, approval, model_status
from hotset_operator.index import ModelEntry, Quota
from hotset_testing.operator_harness import operator_config

CONFIG = operator_config("ops", pod_memory_budget="4Gi")
REQUIRED = {"t": [Quota("t", "gate", require_approval=True)]}


def entry(generation: int = 1, approved: ModelSpec | None = None, approved_generation: int = 1, incumbent: bool = False,
          **fields) -> ModelEntry:
    spec = ModelSpec.model_validate({"id": "m", "framework": "torchvision", "source": "pvc://m/v1", "memory": 2**30,
                                     "replicas": {"min": 1, "max": 1}, **fields})
    status = {} if approved is None else {
        "approval": approval.record(approved_generation, "alice", "t0", approval.gated(approved))}
    return ModelEntry(namespace="t", name="m", uid="u", created="1", spec=spec, problems=(), generation=generation,
                      incumbent=incumbent, gated=approval.gated(spec), approved=approval.approved_of(status),
                      status=status)


def decide(model: ModelEntry, quotas=REQUIRED, config=CONFIG) -> admission.Decision:
    return admission.decide([model], quotas, config).decisions[model.key]


def test_a_new_model_waits_for_approval_where_the_namespace_requires_it():
    waiting = decide(entry())
    assert (waiting.accepted, waiting.reason, waiting.approval) == (False, "ApprovalPending", approval.State.WAITING)
    assert "generation 1 is not served until it is approved, which ModelQuota gate (requireApproval)" in waiting.message
    assert "hotset-approve m -n t" in waiting.message
    assert decide(entry(), quotas={}).approval is approval.State.NOT_REQUIRED  # elsewhere: served at once
    platform = decide(entry(), quotas={}, config=operator_config("ops", require_approval=True))
    assert not platform.accepted and "the platform's policy (policy.requireApproval)" in platform.message


def test_an_approved_model_is_served_and_a_change_keeps_serving_what_was_approved_until_approved():
    v1 = entry().spec
    assert decide(entry(approved=v1)).approval is approval.State.APPROVED
    changed = entry(generation=2, approved=v1, source="pvc://m/v2", version="2", replicas={"min": 2, "max": 2})
    pending = decide(changed)
    assert pending.accepted and pending.approval is approval.State.PENDING
    assert pending.serving is not None and (pending.serving.source, pending.serving.version) == ("pvc://m/v1", "1")
    assert pending.serving.replicas.min == 1
    assert "serving generation 1 as approved by alice; generation 2 changes source, version, replicas" in pending.message
    # what approval does not cover takes effect at once
    described = entry(generation=3, approved=v1, description="now with a description", owner="team-x")
    assert decide(described).approval is approval.State.APPROVED


def test_quota_counts_what_is_served_not_the_change_that_waits():
    v1 = entry().spec
    bigger = entry(generation=2, approved=v1, replicas={"min": 1, "max": 8})
    quotas = {"t": [Quota("t", "gate", require_approval=True, copies=2)]}
    assert decide(bigger, quotas).accepted  # 1 copy served; the 8 wait for approval


def test_a_model_served_before_approval_was_required_keeps_serving_and_records_a_baseline():
    served = entry(incumbent=True)
    decision = decide(served)
    assert decision.accepted and decision.approval is approval.State.BASELINE
    change = model_status.desired(served, decision, [], [], CONFIG)
    assert change.fields["approval"]["approvedBy"] == "" and change.fields["approval"]["spec"]["source"] == "pvc://m/v1"
    assert "history" not in change.fields


def test_a_granted_approval_is_recorded_once_with_its_history_then_its_outcome():
    v1 = entry().spec
    changed = entry(generation=2, approved=v1, version="2", source="pvc://m/v2")
    decision = decide(changed)
    granted = approval.Request(2, "alice", ("approvers", "system:authenticated"))
    change = model_status.desired(changed, decision, [], [], CONFIG, granted)
    assert change.fields["approval"]["generation"] == 2 and change.fields["approval"]["approvedBy"] == "alice"
    assert change.fields["approval"]["spec"]["rollout"] is None  # a merge patch removes what v1 had and v2 lacks
    [latest] = change.fields["history"]
    assert (latest["generation"], latest["changed"], latest["approvedBy"]) == (2, ["source", "version"], "alice")
    assert [(e.reason, e.message) for e in change.events if e.reason == "Approved"] == [
        ("Approved", "generation 2 (source, version) approved by alice")]
    # written: the next status says it, so nothing is recorded twice
    seen = dataclasses.replace(changed, status={**changed.status, **change.fields},
                               approved=approval.approved_of(change.fields))
    assert "approval" not in model_status.desired(seen, decision, [], [], CONFIG, granted).fields
    # admission now serves generation 2; once its copy is ready the history says when and how it went
    approved = decide(seen)
    assert approved.approval is approval.State.APPROVED and approved.serving is None
    ready = model_status.desired(seen, approved, [{"pod": "p", "state": "READY", "bytes": 1}], [], CONFIG)
    [latest] = ready.fields["history"]
    assert latest["outcome"] == "Served" and latest["effectiveAt"]
    assert any(e.reason == "ChangeServed" for e in ready.events)
    failed = model_status.desired(seen, approved, [{"pod": "p", "state": "FAILED", "bytes": 0, "reason": "no such object"}],
                                  [], CONFIG)
    assert failed.fields["history"][-1]["outcome"] == "Failed: load on pod p failed: no such object"


def test_history_keeps_the_last_changes_only():
    v1 = entry().spec
    history = [{"generation": g, "changed": ["version"], "approvedBy": "a", "approvedAt": "t", "outcome": "Served"}
               for g in range(1, approval.HISTORY + 1)]
    changed = entry(generation=20, approved=v1, version="20")
    changed = dataclasses.replace(changed, status={**changed.status, "history": history})
    change = model_status.desired(changed, decide(changed), [], [], CONFIG, approval.Request(20, "bob", ()))
    assert len(change.fields["history"]) == approval.HISTORY
    assert change.fields["history"][0]["generation"] == 2 and change.fields["history"][-1]["generation"] == 20


def test_the_annotations_ask_for_an_approval_only_when_they_name_a_generation_and_someone():
    assert approval.request_of({"approval.hotset.io/generation": "3", "approval.hotset.io/user": "alice",
                                "approval.hotset.io/groups": "a,b"}) == approval.Request(3, "alice", ("a", "b"))
    assert approval.request_of({"approval.hotset.io/generation": "three", "approval.hotset.io/user": "alice"}) is None
    assert approval.request_of({"approval.hotset.io/generation": "3"}) is None
