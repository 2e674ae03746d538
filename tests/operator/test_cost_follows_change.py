"""The operator's work follows what changes, against the real API server, the real operator and real
workers: a restart judges each model once and writes nothing; one model's change writes that model's
status and nothing else, and reaches the pool's catalog as one entry; a catalog larger than the API
server's 1 MiB object limit reaches every worker that follows it."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from hotset_common import metrics as names
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig
from hotset_operator.metrics import OperatorMetrics
from hotset_testing import processes
from hotset_testing.operator_harness import (Cluster, catalog, catalog_models, operator_config, running_operator,
                                              served_model, wait_for)

pytestmark = [pytest.mark.kube]
BALLAST_WORKER = [sys.executable, str(Path(__file__).resolve().parents[1] / "router" / "ballast_worker_main.py")]
KINDS = "servedmodels,modelquotas,workerpools,deployments,replicasets,pods,configmaps,poddisruptionbudgets"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def create_all(cluster: Cluster, models: list[dict]) -> None:
    """One `kubectl create` for many objects (create, not apply: no last-applied annotation, which
    cannot hold a large spec)."""
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": models}))


def versions(cluster: Cluster) -> dict[str, str]:
    """kind/name -> resourceVersion of everything the operator might write; for pods, what it would
    write on them (annotations: the scheduler and the node controller write the rest)."""
    listing = json.loads(cluster.kubectl("get", KINDS, "-o", "json").stdout)["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": json.dumps(i["metadata"].get("annotations") or {}, sort_keys=True)
            if i["kind"] == "Pod" else i["metadata"]["resourceVersion"] for i in listing}


def accepted(cluster: Cluster) -> int:
    items = json.loads(cluster.kubectl("get", "servedmodels", "-o", "json").stdout)["items"]
    return sum(any(c["type"] == "Accepted" and c["status"] == "True" for c in (i.get("status") or {}).get("conditions", []))
               for i in items)


def settled(metrics: OperatorMetrics, passes: float = 2) -> bool:
    """Nothing left to write, and the pool loop ran `passes` passes (whatever it would change, it has)."""
    r = metrics.registry
    return value(r, names.OPERATOR_WRITES_PENDING) == 0 and value(r, names.OPERATOR_POOL_PASSES_TOTAL) >= passes


def quiet_for_two_passes(cluster: Cluster, metrics: OperatorMetrics) -> bool:
    """Whether two more pool passes (and their writes) leave every object as it was."""
    first = versions(cluster)
    passes = value(metrics.registry, names.OPERATOR_POOL_PASSES_TOTAL) + 2
    wait_for(lambda: settled(metrics, passes), "two more pool passes")
    return versions(cluster) == first


def test_a_restart_with_many_models_judges_each_once_and_writes_nothing(cluster: Cluster) -> None:
    count = 150
    config = operator_config(cluster.namespace)
    with running_operator(config):
        create_all(cluster, [served_model(f"m-{i:03d}", memory="64Mi", replicas={"min": 0, "max": 1})
                             for i in range(count)])
        wait_for(lambda: accepted(cluster) == count, f"all {count} models accepted", timeout=90, interval=1.0)
    before = versions(cluster)

    metrics = OperatorMetrics()
    with running_operator(config, metrics):
        wait_for(lambda: len(catalog_models(config, cluster.namespace)) == count, "the catalog served again", 60)
        wait_for(lambda: settled(metrics, passes=3), "the restarted operator settled")
        after = versions(cluster)
        r = metrics.registry
        decisions = value(r, names.OPERATOR_ADMISSION_DECISIONS_TOTAL)
        full_passes = value(r, names.OPERATOR_ADMISSION_PASSES_TOTAL, kind="all")
        written = value(r, names.OPERATOR_STATUS_WRITES_TOTAL, resource="servedmodels")
    # One pass over the models, not one per model (the old resume handlers judged count x count).
    assert decisions <= 2 * count and full_passes <= 2, (decisions, full_passes)
    assert written == 0
    assert after == before


def test_a_change_to_one_model_writes_one_object_and_one_catalog_entry(cluster: Cluster) -> None:
    config = operator_config(cluster.namespace)
    metrics = OperatorMetrics()
    with running_operator(config, metrics):
        create_all(cluster, [served_model(f"m-{i:02d}", memory="64Mi", replicas={"min": i % 2, "max": 1})
                             for i in range(20)])
        cluster.apply(served_model("own", placement="dedicated", memory="64Mi", replicas={"min": 1, "max": 1}))
        wait_for(lambda: accepted(cluster) == 21, "every model accepted", timeout=60)
        wait_for(lambda: len(cluster.items("pods", "hotset.io/pool=shared")) >= 1
                 and cluster.items("pods", "hotset.io/servedmodel=own"), "the pools' pods (pending: no kubelet)")
        wait_for(lambda: settled(metrics), "the operator settled")
        # The pools' status follows their Deployments' (the controller manager reports the pending pods
        # a moment later): settled once two more pool passes change no object.
        wait_for(lambda: quiet_for_two_passes(cluster, metrics), "every object left unchanged by two pool passes")
        held = catalog(config, cluster.namespace)
        assert held is not None and len(held.models) == 20
        before = versions(cluster)
        judged = value(metrics.registry, names.OPERATOR_ADMISSION_DECISIONS_TOTAL)

        cluster.kubectl("patch", "servedmodel", "m-07", "--type=merge", "-p", '{"spec": {"description": "edited"}}')
        generation = cluster.get("servedmodel", "m-07")["metadata"]["generation"]
        wait_for(lambda: (cluster.get("servedmodel", "m-07").get("status") or {}).get("observedGeneration") == generation,
                 "the edit observed")
        passes = value(metrics.registry, names.OPERATOR_POOL_PASSES_TOTAL) + 2
        wait_for(lambda: settled(metrics, passes), "the operator settled again")
        after = versions(cluster)
        # A description is nothing admission reads: no model was judged again.
        assert value(metrics.registry, names.OPERATOR_ADMISSION_DECISIONS_TOTAL) == judged
        # What a worker holding the catalog before the edit is sent: that one model.
        delta = httpx.get(workloads.catalog_url(config, cluster.namespace), params={"since": held.cursor}, timeout=10).json()
    assert {k for k in after if after[k] != before.get(k)} == {"ServedModel/m-07"}  # the user's edit and its status
    assert [m["id"] for m in delta["models"]] == ["m-07"] and delta["models"][0]["description"] == "edited"
    assert delta["complete"] is False and delta["removed"] == []


@contextlib.contextmanager
def ballast_worker(config: OperatorConfig, namespace: str, log: Path) -> Iterator[str]:
    """A real worker process following the pool's catalog, as a pool pod does."""
    port = processes.free_port()
    argv = [*BALLAST_WORKER, "--catalog-url", workloads.catalog_url(config, namespace), "--host", "127.0.0.1",
            "--port", str(port), "--memory-budget", "1Gi", "--triton-url", ""]
    with processes.spawn("worker", argv, log, url=f"http://127.0.0.1:{port}") as worker:
        processes.wait_http(worker, "/v2/health/live", 60)
        yield worker.url


def test_a_catalog_larger_than_one_mebibyte_reaches_every_worker(cluster: Cluster, tmp_path: Path) -> None:
    """The old catalog was one ConfigMap (etcd refuses objects past 1 MiB, and the operator refused
    models past 800 KiB of it); now each model is an entry of its own."""
    config = operator_config(cluster.namespace)
    warmup = [{"text": "w" * 24_000} for _ in range(16)]  # about 384 KB of warm-up inputs per model
    names_ = [f"big-{i}" for i in range(4)]
    with running_operator(config):
        create_all(cluster, [served_model(name, framework="torchvision", task="tensor", memory="10Mi", warmup=warmup)
                             for name in names_])
        wait_for(lambda: catalog_models(config, cluster.namespace) == names_, "every big model in the catalog", 60)
        answer = httpx.get(workloads.catalog_url(config, cluster.namespace), timeout=30)
        assert len(answer.content) > 1.4 * 2**20  # past what one object in etcd may hold
        with ballast_worker(config, cluster.namespace, tmp_path / "a.log") as first, \
                ballast_worker(config, cluster.namespace, tmp_path / "b.log") as second:
            for url in (first, second):
                for name in names_:
                    wait_for(lambda: httpx.get(f"{url}/v2/models/{name}", timeout=10).status_code == 200,
                             f"{name} in the catalog of the worker at {url}")
            cluster.kubectl("delete", "servedmodel", "big-0")
            for url in (first, second):  # a deleted model leaves every worker's catalog
                wait_for(lambda: httpx.get(f"{url}/v2/models/big-0", timeout=10).status_code == 404,
                         f"big-0 gone from the worker at {url}")
