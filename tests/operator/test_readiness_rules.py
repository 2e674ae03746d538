"""How Ready and Accepted are decided from reports and specs (pure functions)."""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState, ModelCopy, WorkerStatus
from hotset_operator import conditions, status, validation
from hotset_operator.config import OperatorConfig
from hotset_operator.fleet import Fleet


def _spec(**fields) -> ModelSpec:
    return ModelSpec(**{"id": "m", "framework": "transformers", "source": "pvc://models/m", **fields})


def _report(pod: str, *copies: tuple[str, CopyState, str]) -> WorkerStatus:
    return WorkerStatus(pod=pod, ready=True, triton_ready=True, memory_budget_bytes=10, used_bytes=0, free_bytes=10,
                        models=[ModelCopy(id=i, framework="transformers", state=s, bytes=5, reason=r) for i, s, r in copies],
                        catalog=[])


def test_copies_are_collected_from_every_pod_for_this_model_only() -> None:
    reports = {"b": _report("b", ("m", CopyState.READY, "")), "a": _report("a", ("m", CopyState.LOADING, ""), ("x", CopyState.READY, ""))}
    assert [(c["pod"], c["state"]) for c in status.copies_of("m", reports)] == [("a", "LOADING"), ("b", "READY")]


def test_ready_needs_min_copies_and_says_why_not() -> None:
    spec = _spec(replicas={"min": 2, "max": 2})
    one = status.copies_of("m", {"a": _report("a", ("m", CopyState.READY, ""))})
    assert status.readiness(spec, one) == (False, "WaitingForCopies", "1 of 2 required copies ready")
    two = one + [{"pod": "b", "state": "READY", "bytes": 1}]
    assert status.readiness(spec, two)[:2] == (True, "CopiesReady")


def test_a_failed_load_names_the_pod_and_the_reason() -> None:
    copies = status.copies_of("m", {"a": _report("a", ("m", CopyState.FAILED, "weights missing"))})
    ready, reason, message = status.readiness(_spec(replicas={"min": 1, "max": 1}), copies)
    assert (ready, reason) == (False, "LoadFailed") and "pod a" in message and "weights missing" in message


def test_a_failed_warm_up_is_reported_as_such() -> None:
    report = _report("a")
    report.models.append(ModelCopy(id="m", framework="transformers", state=CopyState.FAILED,
                                   reason="warm-up of model 'm' failed on input 0 of 1: bad text", failure="WarmupFailed"))
    ready, reason, message = status.readiness(_spec(replicas={"min": 1, "max": 1}), status.copies_of("m", {"a": report}))
    assert (ready, reason) == (False, "WarmupFailed") and "pod a" in message and "bad text" in message


def test_on_demand_models_are_ready_without_copies() -> None:
    assert status.readiness(_spec(), [])[:2] == (True, "LoadOnDemand")


def test_pod_problems_explain_a_missing_dedicated_copy() -> None:
    ready, reason, message = status.readiness(_spec(replicas={"min": 1, "max": 1}, placement="dedicated"), [],
                                              ["pod p: container hotset-worker CrashLoopBackOff"])
    assert (ready, reason) == (False, "PodsFailing") and "CrashLoopBackOff" in message


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = conditions.upsert([], "Ready", False, "WaitingForCopies", "0 of 1", 1, timestamp="T1")
    same = conditions.upsert(first, "Ready", False, "WaitingForCopies", "still 0 of 1", 2, timestamp="T2")
    flipped = conditions.upsert(same, "Ready", True, "CopiesReady", "1 of 1", 2, timestamp="T3")
    assert [c["lastTransitionTime"] for c in (first[0], same[0], flipped[0])] == ["T1", "T1", "T3"]


def test_validation_names_the_field_a_user_writes() -> None:
    config = OperatorConfig(pod_memory_budget="1Gi")
    body = {"metadata": {"name": "m"}, "spec": {"framework": "transformers", "source": {"uri": "pvc://c/../x"},
                                                "replicas": {"min": 3, "max": 1}}}
    verdict = validation.validate(body, config)
    fields = {p.field for p in verdict.problems}
    assert not verdict.accepted and {"spec.source.uri", "spec.replicas"} <= fields
    too_big = validation.validate({"metadata": {"name": "m"}, "spec": {"framework": "triton", "memory": "2Gi",
                                                                      "source": {"uri": "file:///m"}}}, config)
    assert [p.field for p in too_big.problems] == ["spec.memory"]


def test_reports_are_indexed_once_and_only_changed_models_are_named() -> None:
    fleet = Fleet()
    first = {("ns", "a"): _report("a", ("m", CopyState.LOADING, "")), ("ns", "b"): _report("b", ("x", CopyState.READY, ""))}
    assert fleet.update([], first) == {("ns", "m"), ("ns", "x")}
    assert [c["pod"] for c in fleet.copies_of("ns", "m")] == ["a"]
    again = {**first, ("ns", "a"): _report("a", ("m", CopyState.READY, ""))}
    assert fleet.update([], again) == {("ns", "m")}  # x's copies are as they were: its status is not re-derived
    assert fleet.update([], again) == set()
    assert fleet.copies_of("ns", "m")[0]["state"] == "READY" and fleet.copies_of("other", "m") == []
