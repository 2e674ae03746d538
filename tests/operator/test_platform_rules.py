"""The platform's own rules (seed 002) at the operator, against a real API server: a model's latency
class is shown and reaches its pool's workers; owners and on-call contacts are required where the
platform or a namespace's ModelQuota says so, shown by ``kubectl get -o wide`` and exported for the
dashboard's model table and the alerts.

The workers and the router act on the class (tests/worker/test_latency_classes.py,
tests/router/test_routing_with_fake_pods.py); the alerts' join is in test_dashboards_and_alerts.py.
"""
from __future__ import annotations

from hotset_common import metrics as names
from hotset_operator.metrics import OperatorMetrics
from hotset_testing.operator_harness import Cluster, catalog, catalog_models, operator_config, running_operator, \
    served_model, wait_for


def _table(cluster: Cluster, *args: str) -> dict[str, dict[str, str]]:
    """`kubectl get servedmodels` as {name: {COLUMN: value}} (columns holding no spaces)."""
    rows = cluster.kubectl("get", "servedmodels", *args).stdout.splitlines()
    header = rows[0].split()
    return {row.split()[0]: dict(zip(header, row.split())) for row in rows[1:]}


def test_kubectl_shows_the_class_and_the_pool_catalog_carries_it(cluster: Cluster, operator) -> None:
    config, _ = operator
    cluster.apply(served_model("chat", latencyClass="realtime"))
    cluster.apply(served_model("nightly", latencyClass="batch"))
    cluster.apply(served_model("plain"))  # no class: the CRD's default

    def classes() -> dict[str, str] | None:
        found = catalog(config, cluster.namespace)
        entries = {m["id"]: m.get("latency_class") for m in found.models} if found is not None else {}
        return entries if len(entries) == 3 else None

    assert wait_for(classes, "the three models in the pool's catalog") == {
        "chat": "realtime", "nightly": "batch", "plain": "standard"}
    assert {name: row["CLASS"] for name, row in _table(cluster).items()} == {
        "chat": "realtime", "nightly": "batch", "plain": "standard"}


def _info(metrics: OperatorMetrics) -> dict[str, tuple[str, str]]:
    """The operator's hotset_model_info series: model -> (owner, oncall)."""
    found = {}
    for family in metrics.registry.collect():
        if family.name == names.MODEL_INFO:
            for sample in family.samples:
                if sample.value == 1:
                    found[sample.labels["model"]] = (sample.labels["owner"], sample.labels["oncall"])
    return found


def test_a_namespace_quota_that_requires_owners_refuses_a_model_without_them_until_it_names_them(cluster: Cluster) -> None:
    metrics = OperatorMetrics()
    config = operator_config(cluster.namespace)
    with running_operator(config, metrics):
        legacy = served_model("legacy")
        del legacy["spec"]["oncall"]
        cluster.apply(legacy)  # served before the namespace requires contacts
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["legacy"], "the legacy model served")
        cluster.apply({"apiVersion": "hotset.io/v1alpha1", "kind": "ModelQuota", "metadata": {"name": "team"},
                       "spec": {"requireOwner": True}})
        still = wait_for(lambda: (c := cluster.condition("legacy", "Accepted")) and "before the rule" in c["message"]
                         and c, "the legacy model told what to add")
        assert still["status"] == "True" and "spec.oncall is required by ModelQuota team" in still["message"]
        cluster.apply(served_model("named", owner="fraud-team", oncall="fraud-pager"))
        unnamed = served_model("unnamed")
        del unnamed["spec"]["oncall"]
        cluster.apply(unnamed)

        refused = wait_for(lambda: (c := cluster.condition("unnamed", "Accepted")) and c, "Accepted on unnamed")
        assert (refused["status"], refused["reason"]) == ("False", "OwnerRequired")
        assert "spec.oncall is required by ModelQuota team (requireOwner)" in refused["message"]
        assert (cluster.condition("named", "Accepted") or {}).get("status") == "True"
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["legacy", "named"], "the unnamed one not served")
        wide = _table(cluster, "-o", "wide")
        assert (wide["named"]["OWNER"], wide["named"]["ONCALL"]) == ("fraud-team", "fraud-pager")
        # whom the dashboard and the alerts name
        assert _info(metrics) == {"legacy": ("team-a", ""), "named": ("fraud-team", "fraud-pager")}

        cluster.kubectl("patch", "servedmodel", "unnamed", "--type=merge", "-p", '{"spec": {"oncall": "team-a-pager"}}')
        wait_for(lambda: (cluster.condition("unnamed", "Accepted") or {}).get("status") == "True", "accepted once named")
        wait_for(lambda: catalog_models(config, cluster.namespace) == ["legacy", "named", "unnamed"], "all served")
        wait_for(lambda: _info(metrics).get("unnamed") == ("team-a", "team-a-pager"), "its contacts exported")
        cluster.kubectl("delete", "servedmodel", "named")
        wait_for(lambda: "named" not in _info(metrics), "a deleted model's series gone")


def test_the_platform_policy_requires_owners_in_every_namespace(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace, require_owner=True)
    with running_operator(config):
        anonymous = served_model("anonymous")
        del anonymous["spec"]["owner"], anonymous["spec"]["oncall"]
        cluster.apply(anonymous)
        refused = wait_for(lambda: (c := cluster.condition("anonymous", "Accepted")) and c, "Accepted on anonymous")
        assert (refused["status"], refused["reason"]) == ("False", "OwnerRequired")
        assert "spec.owner and spec.oncall are required by the platform's policy (policy.requireOwner)" in refused["message"]
        assert "OwnerRequired" in {e["reason"] for e in cluster.events("anonymous")}
