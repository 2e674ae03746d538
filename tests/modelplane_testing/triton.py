"""A real tritonserver for tests, started through modelplane's own sidecar launcher.

    server = start_tritonserver(repo_dir)
    try:
        ... server.url ...   # "127.0.0.1:PORT", what tritonclient and the worker take
    finally:
        server.stop()

Each server gets free loopback ports and its own log file; ``stop()`` ends it
(and the Python-backend stubs it spawned) by pid. Suites that need several
servers (the router's) call this once per server.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelplane_testing.processes import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0


class TritonStartFailed(RuntimeError):
    """tritonserver did not become ready; the message carries its log's tail."""


@dataclass
class TritonServer:
    """A running tritonserver: its address, pid, ports and log."""

    process: subprocess.Popen[bytes]
    repository: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        """host:port of the HTTP endpoint (tritonclient's form, also WorkerContext.triton_url)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.url}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; stubs left in its process group go too."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        # The server ran in its own session: its pid is the group id of what it spawned.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _launch(repository: Path, log_path: Path, extra_env: dict[str, str] | None,
            ports: tuple[int, int, int] | None = None) -> TritonServer:
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    command = [
        sys.executable, "-m", "modelplane_worker.triton_sidecar",
        "--model-repository", str(repository),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--host", "127.0.0.1",
        "--", "--exit-timeout-secs=2",
    ]
    env = dict(os.environ, **(extra_env or {}))
    log = open(log_path, "ab")
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=REPO_ROOT, start_new_session=True)
    finally:
        log.close()
    return TritonServer(process, repository, http_port, grpc_port, metrics_port, log_path)


def wait_ready(server: TritonServer, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll /v2/health/ready until 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not server.running():
                raise TritonStartFailed(f"tritonserver exited with {server.process.returncode}:\n{server.log_tail()}")
            try:
                if client.get(f"{server.http_url}/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    server.stop()
    raise TritonStartFailed(f"tritonserver not ready after {timeout_s:.0f}s:\n{server.log_tail()}")


def start_tritonserver(repo_dir: Path | str, log_dir: Path | str | None = None,
                       extra_env: dict[str, str] | None = None, attempts: int = 3,
                       ports: tuple[int, int, int] | None = None) -> TritonServer:
    """Start a real tritonserver on free loopback ports serving `repo_dir`; wait until ready.

    Retries on new ports when one was taken between choosing and binding.
    `ports` (http, grpc, metrics) fixes them instead, e.g. to restart a server
    where it was (as a restarted sidecar container comes back); retries then
    use the same ports again.
    """
    repository = Path(repo_dir).resolve()
    repository.mkdir(parents=True, exist_ok=True)
    folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="tritonserver-"))
    last_error: TritonStartFailed | None = None
    for attempt in range(attempts):
        server = _launch(repository, folder / f"tritonserver-{attempt}.log", extra_env, ports)
        try:
            wait_ready(server)
            return server
        except TritonStartFailed as exc:
            server.stop()
            last_error = exc
            if "already in use" not in server.log_tail():
                break
    assert last_error is not None
    raise last_error
