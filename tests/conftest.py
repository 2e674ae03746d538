"""Fixtures shared by every test suite."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hotset_testing import kube_cluster as kube_cluster_module

CRD_DIR = Path(__file__).resolve().parents[1] / "crds"


@pytest.fixture(scope="session")
def kube_cluster_binaries() -> kube_cluster_module.Binaries:
    """The control plane binaries; fails (never skips) with the install command when absent."""
    try:
        return kube_cluster_module.find_binaries()
    except kube_cluster_module.BinariesMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def kube_cluster(kube_cluster_binaries: kube_cluster_module.Binaries,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube_cluster_module.KubeCluster]:
    """A real etcd + kube-apiserver + controller-manager + scheduler for the session.

    Yields a KubeCluster: `.kubeconfig` (admin), `.server`, `.pids`, `.kubectl(...)`.
    The project's CRDs are installed before the controllers start.
    """
    crds = sorted(CRD_DIR.glob("*.yaml"))
    with kube_cluster_module.running(tmp_path_factory.mktemp("kube"), manifests=crds) as cluster:
        yield cluster
