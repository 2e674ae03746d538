"""Startup, readiness and liveness probes with the kubelet's thresholds.

httpGet (2xx/3xx is success), tcpSocket and exec are supported. The host is the
pod IP unless the probe names one; named ports resolve through the container's
``ports``. Defaults follow Kubernetes: period 10 s, timeout 1 s, success 1,
failure 3.
"""
from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def resolve_port(port: int | str, container: dict[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"probe names port {port!r}, which the container does not declare")


def check_once(probe: dict[str, Any], container: dict[str, Any], pod_ip: str, env: dict[str, str],
               rewrite: Any) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    if "httpGet" in probe:
        http = probe["httpGet"]
        host = rewrite(http.get("host") or pod_ip)
        url = f"{http.get('scheme', 'HTTP').lower()}://{host}:{resolve_port(http['port'], container)}{http.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in http.get("httpHeaders") or []}
        try:
            answer = httpx.get(url, headers=headers, timeout=timeout, verify=False)
        except httpx.HTTPError:
            return False
        return 200 <= answer.status_code < 400
    if "tcpSocket" in probe:
        tcp = probe["tcpSocket"]
        try:
            with socket.create_connection((rewrite(tcp.get("host") or pod_ip), resolve_port(tcp["port"], container)), timeout):
                return True
        except OSError:
            return False
    if "exec" in probe:
        try:
            done = subprocess.run(probe["exec"]["command"], env=env, timeout=timeout, capture_output=True)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0
    raise ValueError(f"unsupported probe handler {sorted(probe)}")


@dataclass
class ProbeTracker:
    """One probe of one container run: counts consecutive results against thresholds."""

    spec: dict[str, Any]
    started_at: float = field(default_factory=time.monotonic)
    last_run: float = 0.0
    successes: int = 0
    failures: int = 0
    passing: bool = False  # the probe's verdict so far (startup/readiness start False)
    failed: bool = False   # failureThreshold reached (liveness/startup: restart)

    def due(self, now: float) -> bool:
        if now - self.started_at < float(self.spec.get("initialDelaySeconds", 0)):
            return False
        return now - self.last_run >= float(self.spec.get("periodSeconds", 10))

    def record(self, ok: bool, now: float) -> None:
        self.last_run = now
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.passing = True
                self.failed = False
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.passing = False
                self.failed = True
