"""The chart as both e2e tiers install it: ``helm template`` with the tier's values, then a server-side apply.

Re-installing with other values (a bigger pool, another memory budget) is
what a user does with ``helm upgrade --set``. The tiers differ only in where
helm comes from and how it is run, so each gives ``rendered_manifest()`` and
inherits the rest from ChartInstall.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from scenarios.platform import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "modelplane"
RELEASE = "modelplane"


def helm_template_argv(helm: str, namespace: str, values: Path, overrides: Mapping[str, Any]) -> list[str]:
    """``helm template`` of the chart with a tier's values file, CRDs included, and ``--set-string`` overrides."""
    argv = [helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds", "-f", str(values)]
    for key, value in overrides.items():
        argv += ["--set-string", f"{key}={value}"]
    return argv


class ChartInstall:
    """install / set_pool_size / set_memory_budget for a tier's platform (a dataclass with these attributes)."""

    cluster: Kubectl
    namespace: str
    overrides: dict[str, Any]

    def rendered_manifest(self) -> str:
        """The chart rendered with the tier's values and `self.overrides`."""
        raise NotImplementedError

    def install(self, **overrides: Any) -> None:
        """Render with these overrides added to the earlier ones and apply (server-side, as the only manager)."""
        self.overrides.update(overrides)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-n", self.namespace, "-f", "-",
                             input=self.rendered_manifest(), timeout=180)

    def set_pool_size(self, pods: int) -> None:
        self.install(**{"workers.pool.minPods": pods})

    def set_memory_budget(self, budget_bytes: int) -> None:
        self.install(**{"workers.memoryBudget": budget_bytes})
