"""The chart's Grafana dashboard and PrometheusRule: off by default, accepted by the real API server
when on, and every query in them names metrics (and labels) that the code really exports."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import promql_parser
import yaml

from hotset_operator.metrics import OperatorMetrics
from hotset_router.telemetry import RouterMetrics
from hotset_testing import chart
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import Cluster
from hotset_worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING_CRDS = ROOT / "tests" / "fixtures" / "monitoring-crds.yaml"
ON = ["--set", "monitoring.dashboard.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
      "--set", "serviceMonitor.enabled=true"]


def _render(kube: KubeCluster, namespace: str, *extra: str) -> list[dict[str, Any]]:
    return chart.render(kube, *extra, namespace=namespace)


def _exported() -> dict[str, set[str]]:
    """Every series name the operator, the router and the workers export, with its label names."""
    series: dict[str, set[str]] = {}
    for registry in (OperatorMetrics().registry, RouterMetrics().registry, WorkerMetrics("p", 1).registry):
        for collector in list(registry._collector_to_names):  # the metric objects themselves
            name, kind, labels = collector._name, collector._type, set(collector._labelnames)
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(kind, [""])
            for suffix in suffixes:
                series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def _selectors(node: Any) -> Iterator[Any]:
    """Every vector selector in a parsed PromQL expression."""
    if type(node).__name__ == "VectorSelector":
        yield node
    for attribute in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _selectors(child)
    for child in getattr(node, "args", None) or []:
        yield from _selectors(child)


def _grouping(expression: str) -> set[str]:
    return {label.strip() for group in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expression)
            for label in group.split(",") if label.strip()}


def _queries(documents: list[dict[str, Any]]) -> dict[str, str]:
    """Where each query is -> the query: every dashboard target and every alert's expr."""
    found: dict[str, str] = {}
    configmap = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hotset-dashboard")
    dashboard = json.loads(configmap["data"]["hotset.json"])
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    rule = next(d for d in documents if d["kind"] == "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for item in group["rules"]:
            found[f"alert {item['alert']}"] = item["expr"]
    return found


def test_off_unless_asked_for(kube_cluster: KubeCluster) -> None:
    kinds = {d["kind"] for d in _render(kube_cluster, "ns")}
    assert "PrometheusRule" not in kinds and "hotset-dashboard" not in {
        d["metadata"]["name"] for d in _render(kube_cluster, "ns")}


def test_every_query_selects_metrics_and_labels_the_code_exports(kube_cluster: KubeCluster) -> None:
    exported = _exported()
    queries = _queries(_render(kube_cluster, "ns", *ON))
    assert len(queries) >= 20 and {q for q in queries if q.startswith("alert ")} == {
        "alert HotsetModelThrashing", "alert HotsetLoadFailures", "alert HotsetNoCapacity",
        "alert HotsetPoolAtMaximum"}
    problems = []
    for where, query in queries.items():
        parsed = promql_parser.parse(re.sub(r"\$__(rate_interval|range|interval)", "5m", query))
        selectors = list(_selectors(parsed))
        if not selectors:
            problems.append(f"{where}: selects no metric")
        labels: set[str] = set()
        for selector in selectors:
            if selector.name not in exported:
                problems.append(f"{where}: {selector.name} is not exported by the operator, router or workers")
                continue
            labels |= exported[selector.name]
            matchers = {m.name for m in selector.matchers.matchers} - {"__name__"}
            if unknown := matchers - exported[selector.name]:
                problems.append(f"{where}: {selector.name} has no label {sorted(unknown)}")
        if selectors and (unknown := _grouping(query) - labels):
            problems.append(f"{where}: groups by {sorted(unknown)}, which none of its metrics carries")
    assert problems == []


def test_the_real_api_server_accepts_the_dashboard_and_the_alerts(cluster: Cluster) -> None:
    cluster.kube.kubectl("apply", "-f", str(MONITORING_CRDS))
    cluster.kube.kubectl("wait", "--for=condition=Established", "crd/prometheusrules.monitoring.coreos.com",
                         "crd/podmonitors.monitoring.coreos.com", "crd/servicemonitors.monitoring.coreos.com")
    documents = [d for d in _render(cluster.kube, cluster.namespace, *ON)
                 if d["kind"] in ("PrometheusRule", "PodMonitor", "ServiceMonitor")
                 or d["metadata"]["name"] == "hotset-dashboard"]
    assert sorted(d["kind"] for d in documents) == ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule",
                                                   "ServiceMonitor"]
    manifest = "\n---\n".join(yaml.safe_dump(d) for d in documents)
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert result.returncode == 0, result.stderr
    # The rule's shape is enforced, not just stored: a rule that is neither alert nor record is refused.
    broken = next(d for d in documents if d["kind"] == "PrometheusRule")
    del broken["spec"]["groups"][0]["rules"][0]["alert"]
    refused = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(broken), check=False)
    assert refused.returncode != 0 and "either an alert or a recording rule" in refused.stderr
