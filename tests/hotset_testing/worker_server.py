"""Real worker servers for tests: uvicorn in a thread (in-process frameworks) or the CLI in a subprocess.

Both listen on a free loopback port, are waited for by polling with a
deadline, and are stopped when the context exits, failure or not.
"""
from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import uvicorn
from hotset_testing import ballast_framework as ballast, polling
from hotset_testing.processes import REPO, free_port, spawn, wait_http
from hotset_common.eviction import EvictionPolicy
from hotset_common.http import ASGIApp
from hotset_common.worker_identity import BearerToken
from hotset_worker import api
from hotset_worker.callers import CallerCheck, SharedToken
from hotset_worker.backends import Backends
from hotset_worker.manager import ModelManager
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.frameworks.base import WorkerContext
from hotset_worker.store import ModelStore
from hotset_worker.triton_backend import TritonBackend

__all__ = ["REPO", "ballast_app", "free_port", "serve_in_thread", "wait_until", "worker_process"]


def wait_until(condition, timeout_s: float = 30.0, interval_s: float = 0.02, what: str = "condition") -> Any:
    """polling.wait_for, with the argument names the worker tests use."""
    return polling.wait_for(condition, what, timeout_s, interval_s)


def ballast_app(
    store: ModelStore,
    budget: int,
    *,
    triton_url: str = "",
    max_body_bytes: int = api.DEFAULT_MAX_BODY_BYTES,
    pod_name: str = "test-pod",
    api_token: str = "",
    callers: CallerCheck | None = None,
    identity: BearerToken | None = None,
    max_model_queue: int = 64,
    file_roots: tuple[Path, ...] | None = None,
    inference_threads: int | None = None,
    grpc_address: str | None = None,
    **manager_options: Any,
) -> ASGIApp:
    """A complete worker app whose in-process models are ballast models (`grpc_address`: OIP v2
    over gRPC there too, e.g. ``127.0.0.1:0``; the port is in its ``/status``). `api_token`: one fixed
    token callers must send (a local stack's); `callers`: another check (a cluster pod's); `identity`:
    what ``/identity`` hands out."""
    metrics = WorkerMetrics(pod_name, budget)
    backends = Backends([TritonBackend(triton_url)])
    manager_options.setdefault("policy", EvictionPolicy(churn_guard_s=0))
    manager = ModelManager(
        store, WorkerContext(backends=backends.by_name(), file_roots=file_roots), budget,
        observer=metrics, preflight=backends.require, create_worker=ballast.create_worker, **manager_options,
    )
    return api.create_app(manager, metrics, backends, pod_name=pod_name, max_body_bytes=max_body_bytes, pinned_check_s=0.2,
                          callers=callers or (SharedToken(api_token) if api_token else None), identity=identity,
                          max_model_queue=max_model_queue, inference_threads=inference_threads,
                          grpc_address=grpc_address)


@contextlib.contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Serve `app` with a real uvicorn on a free loopback port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), what="uvicorn to start")
        if not server.started:
            raise RuntimeError("uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextlib.contextmanager
def worker_process(args: list[str], env: dict[str, str] | None = None, timeout_s: float = 60.0,
                   port: int | None = None) -> Iterator[str]:
    """Run the real ``hotset-worker`` CLI on a loopback port (a free one unless given); yields its base URL.

    Its log goes to stderr when anything fails, the test's own assertions included.
    """
    port = port or free_port()
    command = [sys.executable, "-m", "hotset_worker.main", "--host", "127.0.0.1", "--port", str(port), *args]
    with tempfile.TemporaryDirectory(prefix="hotset-worker-") as scratch:
        worker = spawn("worker", command, Path(scratch) / "worker.log", env=env, url=f"http://127.0.0.1:{port}",
                       stop_timeout_s=15)
        try:
            with worker:
                wait_http(worker, "/v2/health/live", timeout_s, tail_lines=10_000)
                yield worker.url
        except BaseException:
            print(f"--- worker log ---\n{worker.log()[-5000:]}", file=sys.stderr)
            raise
