"""A real tritonserver for tests, started through hotset's own sidecar launcher.

    server = start_tritonserver(repo_dir)
    try:
        ... server.url ...   # "127.0.0.1:PORT", what tritonclient and the worker take
    finally:
        server.stop()

Each server gets free loopback ports and its own log file; ``stop()`` ends it
(and the Python-backend stubs it spawned) by pid. Suites that need several
servers (the router's) call this once per server. ``supervised=True`` runs it
as a worker pod's sidecar container does: under the operator's shell loop
(``workloads.TRITON_SUPERVISOR``), which starts tritonserver again when it
exits; ``tritonserver_pid()`` is then the server's own pid (killing it is a
Triton crash inside a container that keeps running).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hotset_testing.processes import Process, free_ports, spawn, wait_http

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


class TritonStartFailed(RuntimeError):
    """tritonserver did not become ready; the message carries its log's tail."""


@dataclass
class TritonServer:
    """A running tritonserver: its process, repository and ports."""

    process: Process
    repository: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    pid_file: Path | None = None  # supervised: where the loop writes tritonserver's pid

    def tritonserver_pid(self) -> int:
        """tritonserver's own pid (under the loop, not the loop's)."""
        return int(self.pid_file.read_text()) if self.pid_file is not None else self.pid

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def url(self) -> str:
        """host:port of the HTTP endpoint (tritonclient's form, also WorkerContext.triton_url)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.url}"

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

    def running(self) -> bool:
        return self.process.alive()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to tritonserver (it stops its Python-backend stubs itself), SIGKILL after `timeout_s`;
        then SIGKILL to any stub left in its process group, also when the server had already died."""
        self.process.stop(timeout_s)


def _launch(repository: Path, log_path: Path, extra_env: dict[str, str] | None,
            ports: tuple[int, int, int] | None = None, supervised: bool = False) -> TritonServer:
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    command: list[str] = [
        sys.executable, "-m", "hotset_worker.triton_sidecar",
        "--model-repository", str(repository),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--host", "127.0.0.1",
        "--", "--exit-timeout-secs=2",
    ]
    pid_file = None
    if supervised:
        from hotset_operator.workloads import TRITON_SUPERVISOR

        pid_file = log_path.with_suffix(".pid")
        extra_env = {**(extra_env or {}), "HOTSET_TRITON_PID_FILE": str(pid_file)}
        command = ["/bin/sh", "-c", TRITON_SUPERVISOR, "triton-supervisor", *command]
    # Its own session, so its pid is the group id of the stubs it spawns; signalled alone, group swept after.
    process = spawn("tritonserver", command, log_path, env=extra_env, url=f"http://127.0.0.1:{http_port}",
                    own_session=True, sweep_group=True, stop_timeout_s=STOP_TIMEOUT_S, append=True)
    return TritonServer(process, repository, http_port, grpc_port, metrics_port, pid_file)


def wait_ready(server: TritonServer, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll /v2/health/ready until 200; fail early (with the log's tail) if the process exits."""
    try:
        wait_http(server.process, "/v2/health/ready", timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        raise TritonStartFailed(str(exc)) from None


def start_tritonserver(repo_dir: Path | str, log_dir: Path | str | None = None,
                       extra_env: dict[str, str] | None = None, attempts: int = 3,
                       ports: tuple[int, int, int] | None = None, supervised: bool = False) -> TritonServer:
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
        server = _launch(repository, folder / f"tritonserver-{attempt}.log", extra_env, ports, supervised)
        try:
            wait_ready(server)
            return server
        except TritonStartFailed as exc:
            server.stop()
            last_error = exc
            if "already in use" not in server.process.log():
                break
    assert last_error is not None
    raise last_error
