"""The ownership rule itself (hotset_common.worker_ownership), one case per way a pod can fail it.

test_owned_worker_pods.py holds the same rule on a real API server with its controllers."""
from __future__ import annotations

from hotset_common.worker_ownership import PodClaim, ReplicaSetEntry, Controller, selects, why_not_owned

POD_LABELS = {"app.kubernetes.io/component": "worker", "pod-template-hash": "abc"}
RS = ReplicaSetEntry("rs-uid", Controller("Deployment", "hotset-pool", "dep-uid"),
                     {"matchLabels": {"app.kubernetes.io/component": "worker", "pod-template-hash": "abc"}})
REPLICA_SETS = {("team-a", "hotset-pool-abc"): RS}
OPERATORS = {("team-a", "hotset-pool"): "dep-uid"}


def claim(kind: str = "ReplicaSet", name: str = "hotset-pool-abc", uid: str = "rs-uid",
          labels: dict[str, str] = POD_LABELS) -> PodClaim:
    return PodClaim(Controller(kind, name, uid), tuple(sorted(labels.items())))


def test_a_pod_of_the_operators_deployment_is_owned_and_every_other_is_refused_with_why() -> None:
    assert why_not_owned("team-a", claim(), REPLICA_SETS, OPERATORS) == ""
    refused = {
        "no controller": why_not_owned("team-a", PodClaim(None, tuple(POD_LABELS.items())), REPLICA_SETS, OPERATORS),
        "a Job's pod": why_not_owned("team-a", claim(kind="Job"), REPLICA_SETS, OPERATORS),
        "a forged uid": why_not_owned("team-a", claim(uid="forged"), REPLICA_SETS, OPERATORS),
        "another namespace": why_not_owned("team-b", claim(), REPLICA_SETS, OPERATORS),
        "labels it does not select": why_not_owned("team-a", claim(labels={"app.kubernetes.io/component": "worker"}),
                                                   REPLICA_SETS, OPERATORS),
        "a look-alike Deployment": why_not_owned("team-a", claim(), REPLICA_SETS, {}),
        "a Deployment recreated with another uid": why_not_owned("team-a", claim(), REPLICA_SETS,
                                                                 {("team-a", "hotset-pool"): "new-uid"}),
    }
    assert all(refused.values()), refused
    assert "not one the operator manages" in refused["a look-alike Deployment"]


def test_selectors_match_as_the_api_server_reads_them() -> None:
    labels = {"a": "1", "b": "2"}
    assert selects({"matchLabels": {"a": "1"}}, labels)
    assert not selects({}, labels)  # empty selects nothing
    assert selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]},
                                         {"key": "c", "operator": "DoesNotExist"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["0"]}]}, labels)
