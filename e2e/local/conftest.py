"""Fixtures for the local e2e tier: a real control plane plus the node agent.

The control plane is the operator suite's (modelplane_testing.kube_cluster);
the node agent (node_agent.py) plays the kubelet for fake GPU nodes. When a
test fails, object state, events, describe output and every log are printed.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this tier's helpers, and e2e/scenarios shared with the kind tier

from agent_process import AgentProcess, start_agent, wait_for  # noqa: E402
from diagnostics import dump  # noqa: E402
from kube import Kube, condition  # noqa: E402
from modelplane_testing import kube_cluster as kube_cluster_mod  # noqa: E402
from platform_local import REPO, LocalPlatform, prepare_namespace  # noqa: E402
from scenarios.platform import Kube as ScenarioKube  # noqa: E402

NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
_state: dict[str, object] = {}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube_cluster_mod.KubeCluster]:
    try:
        kube_cluster_mod.find_binaries()
    except kube_cluster_mod.BinariesMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    with kube_cluster_mod.running(tmp_path_factory.mktemp("kube")) as running:
        _state["cluster"] = running
        yield running
        _state.pop("cluster", None)


@pytest.fixture(scope="session")
def kube(cluster: kube_cluster_mod.KubeCluster) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="session")
def agent(cluster: kube_cluster_mod.KubeCluster, kube: Kube,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """The node agent with four one-GPU nodes, all Ready before tests start."""
    root = tmp_path_factory.mktemp("agent")
    pvc_root = root / "pvc"
    pvc_root.mkdir()
    running = start_agent(cluster.kubeconfig, root / "state", NODES, gpus=1, pvc_root=pvc_root)
    _state["agent"] = running
    try:
        def nodes_ready() -> bool:
            # The node lifecycle controller taints a new node not-ready until it has seen it Ready.
            nodes = kube.items("nodes")
            return len(nodes) == len(NODES) and all(
                condition(n, "Ready") == "True" and not n["spec"].get("taints") for n in nodes)

        wait_for("the agent's nodes to be Ready and untainted", nodes_ready, timeout=90)
        yield running
    finally:
        running.stop()
        _state.pop("agent", None)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """The sample models (`modelplane-samples`, idempotent: seconds when already built)."""
    out = REPO / "build" / "models"
    subprocess.run([str(Path(sys.executable).parent / "modelplane-samples"), "--out", str(out)], check=True,
                   capture_output=True, timeout=900)
    return out.resolve()


@pytest.fixture(scope="session")
def platform(cluster: kube_cluster_mod.KubeCluster, agent: AgentProcess, models_dir: Path) -> LocalPlatform:
    """modelplane installed from the chart (helm template + kubectl apply), operator and router Ready."""
    prepare_namespace(cluster, models_dir)
    installed = LocalPlatform(cluster, agent)
    installed.install()
    installed.wait_installed()
    return installed


@pytest.fixture(scope="session")
def sm_kube(platform: LocalPlatform) -> ScenarioKube:
    return platform.kube


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        text = dump(_state.get("cluster"), _state.get("agent"))  # type: ignore[arg-type]
        report.sections.append(("e2e diagnostics", text))
