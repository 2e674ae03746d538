"""A ServedModel's latency class is shown by kubectl and reaches its pool's workers.

The workers and the router act on it (tests/worker/test_latency_classes.py,
tests/router/test_routing_with_fake_pods.py); this is the operator's part, against a
real API server: the CRD's default and column, and the catalog the pool's pods follow.
"""
from __future__ import annotations

from hotset_testing.operator_harness import Cluster, catalog, served_model, wait_for


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
    table = cluster.kubectl("get", "servedmodels").stdout.splitlines()
    header = table[0].split()
    assert "CLASS" in header
    shown = {row.split()[0]: row.split()[header.index("CLASS")] for row in table[1:]}
    assert shown == {"chat": "realtime", "nightly": "batch", "plain": "standard"}
