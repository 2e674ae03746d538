"""The Helm chart as the tests see it: rendered by the real helm, parsed into documents.

One way to run helm for every chart test, so that each test says which values it
sets and what it expects of the documents, not how helm is called.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hotset_testing.kube_cluster import KubeCluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "hotset"
RELEASE = "hotset"


def helm(kube: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """helm with the test control plane's environment; a missing helm fails the test (no skip)."""
    if kube.binaries.helm is None:
        pytest.fail("helm is missing; run `make install-k8s`", pytrace=False)
    return subprocess.run([str(kube.binaries.helm), *args], capture_output=True, text=True, timeout=60,
                          env=kube.env())


def template(kube: KubeCluster, *args: str, namespace: str | None = None) -> str:
    """`helm template` of the chart (as release `hotset`, into `namespace`) with `args` (--set,
    --set-json, --show-only...): the manifest text, which must render."""
    where = ["--namespace", namespace] if namespace else []
    result = helm(kube, "template", RELEASE, str(CHART), *where, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(kube: KubeCluster, *args: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """`template`'s documents, parsed (empty ones dropped)."""
    return [d for d in yaml.safe_load_all(template(kube, *args, namespace=namespace)) if d]


def document(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def env_values(deployment: dict[str, Any]) -> dict[str, str]:
    """The plain (`value`) environment of a Deployment's first container."""
    return {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
