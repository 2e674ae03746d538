"""Start and stop the node agent as a real process, for the e2e fixtures.

Tests find a pod's container processes through the agent's state folder
(``pods/<namespace>/<pod>/<container>.pid|.log``).
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from modelplane_testing.processes import Process, spawn
from scenarios.platform import wait_for

__all__ = ["AgentProcess", "process_alive", "start_agent", "wait_for"]

AGENT = Path(__file__).resolve().parent / "node_agent.py"


@dataclass
class AgentProcess:
    state_dir: Path
    nodes: list[str]
    process: Process
    stopped_pids: list[int] = field(default_factory=list)

    def pod_dir(self, namespace: str, pod: str) -> Path:
        return self.state_dir / "pods" / namespace / pod

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        return int((self.pod_dir(namespace, pod) / f"{container}.pid").read_text())

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        path = self.pod_dir(namespace, pod) / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def all_pid_files(self) -> list[Path]:
        return sorted((self.state_dir / "pods").glob("*/*/*.pid"))

    def log(self) -> str:
        return self.process.log()

    def stop(self) -> None:
        """SIGTERM the agent (it stops its pods' processes), then kill any leftover by pid."""
        self.process.stop(60)
        for pid_file in self.all_pid_files():
            pid = int(pid_file.read_text())
            if process_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.stopped_pids.append(pid)


def process_alive(pid: int) -> bool:
    """True while the pid runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_agent(kubeconfig: Path, state_dir: Path, nodes: list[str], gpus: int = 1,
                pvc_root: Path | None = None) -> AgentProcess:
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "agent.log"
    argv = [sys.executable, str(AGENT), "--kubeconfig", str(kubeconfig), "--state-dir", str(state_dir),
            "--gpus", str(gpus)]
    for node in nodes:
        argv += ["--node", node]
    if pvc_root:
        argv += ["--pvc-root", str(pvc_root)]
    process = spawn("node agent", argv, log_path, append=True)
    return AgentProcess(state_dir=state_dir, nodes=nodes, process=process)

