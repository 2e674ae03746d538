"""Fixtures for operator tests: the CRD installed in the real API server, a fresh
namespace per test, and the operator itself running through kopf.testing.KopfRunner."""
from __future__ import annotations

import uuid
from typing import Iterator

import pytest
from kopf.testing import KopfRunner

from hotset_operator.config import OperatorConfig
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import CRD, Cluster, operator_config, running_operator


@pytest.fixture(scope="session")
def crd_installed(kube_cluster: KubeCluster) -> KubeCluster:
    kube_cluster.kubectl("apply", "-f", str(CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", "crd/servedmodels.hotset.io", "--timeout=60s")
    return kube_cluster


@pytest.fixture
def cluster(crd_installed: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A fresh namespace (deleted afterwards) and KUBECONFIG aimed at the test cluster."""
    monkeypatch.setenv("KUBECONFIG", str(crd_installed.kubeconfig))
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    crd_installed.kubectl("create", "namespace", namespace)
    try:
        yield Cluster(crd_installed, namespace)
    finally:
        crd_installed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[tuple[OperatorConfig, KopfRunner]]:
    config = operator_config(cluster.namespace)
    with running_operator(config) as runner:
        yield config, runner
