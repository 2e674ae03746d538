"""What an e2e failure prints: object state, events, describe, and logs.

Printed by the conftest hook when a test fails, so a red CI run says why
without a rerun.
"""
from __future__ import annotations

from pathlib import Path

from agent_process import AgentProcess
from modelplane_testing.kube_cluster import KubeCluster

TAIL_CHARS = 4000
# Control-plane log lines that say nothing about a failure here.
NOISE = ("configmap_cafile_content", "may not be in the loopback range", "is not as new as written version")


def tail(text: str, chars: int = TAIL_CHARS) -> str:
    return text if len(text) <= chars else "...\n" + text[-chars:]


def dump(cluster: KubeCluster | None, agent: AgentProcess | None) -> str:
    parts: list[str] = []
    if cluster is not None:
        for args in (["get", "nodes,pods,deployments,services", "-A", "-o", "wide"],
                     ["get", "servedmodels", "-A", "-o", "yaml"],
                     ["get", "events", "-A", "--sort-by=.lastTimestamp"],
                     ["describe", "pods", "-A"]):
            result = cluster.kubectl(*args, check=False, timeout=60)
            parts.append(f"$ kubectl {' '.join(args)}\n{tail(result.stdout + result.stderr, 12000)}")
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            lines = [line for line in cluster.log(component).splitlines() if not any(n in line for n in NOISE)]
            parts.append(f"--- {component} log (tail)\n{tail(chr(10).join(lines), 1500)}")
    if agent is not None:
        parts.append(f"--- node agent log (tail)\n{tail(agent.log())}")
        for log_path in sorted((agent.state_dir / "pods").glob("*/*/*.log")):
            rel = log_path.relative_to(agent.state_dir / "pods")
            parts.append(f"--- container log {rel} (tail)\n{tail(Path(log_path).read_text(errors='replace'))}")
    return "\n\n".join(parts)
