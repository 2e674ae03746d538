#!/usr/bin/env python3
"""Start a local hotset stack on 127.0.0.1: a router in front of two workers, each with its own Triton sidecar.

``make run`` runs this file: it waits until the stack is ready, prints where
to send requests and an example curl, and stops every process it started (by
pid) on Ctrl-C. Tests and benchmarks import it (``start_stack``,
``start_worker``, ``start_router``) to get the same real processes.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests"))  # the process helpers the tests and benchmarks use too

from hotset_testing.processes import Process, free_port, spawn, wait_http  # noqa: E402


def start_triton(name: str, repository: Path, log_dir: Path) -> Process:
    """A real tritonserver through the project's sidecar launcher, on free loopback ports."""
    repository.mkdir(parents=True, exist_ok=True)
    http_port = free_port()
    argv = [str(BIN / "hotset-triton"), "--model-repository", str(repository), "--host", "127.0.0.1",
            "--http-port", str(http_port), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    return spawn(name, argv, log_dir / f"{name}.log", url=f"http://127.0.0.1:{http_port}")


def start_worker(
    name: str,
    model_store: Path,
    log_dir: Path,
    memory_budget: str = "2Gi",
    triton: Process | None = None,
    triton_repository: Path | None = None,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
    host: str = "127.0.0.1",
) -> Process:
    """A real ``hotset-worker`` process (or `launcher`, which takes the same arguments)."""
    port = port or free_port()
    argv = list(launcher or [str(BIN / "hotset-worker")])
    argv += ["--model-store", str(model_store), "--host", host, "--port", str(port),
             "--memory-budget", memory_budget, "--pod-name", name,
             "--triton-url", triton.url.removeprefix("http://") if triton else ""]
    if triton_repository is not None:
        argv += ["--triton-repository", str(triton_repository)]
    argv += list(extra_args)
    return spawn(name, argv, log_dir / f"{name}.log", url=f"http://{host}:{port}")


def start_router(
    worker_urls: Sequence[str],
    log_dir: Path,
    port: int | None = None,
    model_store: Path | None = None,
    extra_args: Sequence[str] = (),
    name: str = "router",
) -> Process:
    port = port or free_port()
    argv = [str(BIN / "hotset-router"), "--workers", ",".join(worker_urls), "--host", "127.0.0.1", "--port", str(port)]
    if model_store is not None:
        argv += ["--model-store", str(model_store)]
    argv += list(extra_args)
    return spawn(name, argv, log_dir / f"{name}.log", url=f"http://127.0.0.1:{port}")


@dataclasses.dataclass
class Stack:
    router: Process | None
    workers: list[Process]
    sidecars: list[Process]

    @property
    def processes(self) -> list[Process]:
        return [p for p in (self.router, *self.workers, *self.sidecars) if p is not None]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def stop(self) -> None:
        """Router first, then workers, then sidecars: each by its own pid."""
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.stop()


def start_stack(
    model_store: Path = ROOT / "build/models/model-store.json",
    workers: int = 2,
    router_port: int | None = 8080,
    with_triton: bool = True,
    memory_budget: str = "2Gi",
    work_dir: Path = ROOT / "build/stack",
    router_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
    worker_launcher: Sequence[str] | None = None,
    deadline_s: float = 120.0,
    grpc_port: int | None = None,
) -> Stack:
    """Start sidecars, workers and the router; return once all are ready (stop everything on failure).
    `grpc_port`: the router serves OIP v2 over gRPC there too (the workers on free ports they report)."""
    log_dir = work_dir / "logs"
    if grpc_port is not None:
        worker_args = [*worker_args, "--grpc-port", "0"]
        router_args = [*router_args, "--grpc-port", str(grpc_port)]
    stack = Stack(router=None, workers=[], sidecars=[])
    try:
        for i in range(workers):
            name = f"worker-{i + 1}"
            repository = work_dir / name / "triton-repository"
            if repository.exists():
                shutil.rmtree(repository)
            sidecar = start_triton(f"{name}-triton", repository, log_dir) if with_triton else None
            if sidecar:
                stack.sidecars.append(sidecar)
            stack.workers.append(start_worker(name, model_store, log_dir, memory_budget, sidecar,
                                              repository if sidecar else None, extra_args=worker_args,
                                              launcher=worker_launcher))
        for sidecar in stack.sidecars:
            wait_http(sidecar, "/v2/health/ready", deadline_s)
        for worker in stack.workers:
            wait_http(worker, "/v2/health/ready", deadline_s)
        stack.router = start_router([w.url for w in stack.workers], log_dir, router_port, model_store, router_args)
        wait_http(stack.router, "/v2/health/ready", deadline_s)
    except BaseException:
        stack.stop()
        raise
    return stack


@contextlib.contextmanager
def running_stack(**options) -> Iterator[Stack]:
    stack = start_stack(**options)
    try:
        yield stack
    finally:
        stack.stop()


def example_request(model_store: Path) -> tuple[str, dict]:
    """An example /predict body for a sample model the store names (a text classifier when there is one)."""
    models = json.loads(model_store.read_text()).get("models", [])
    for model in models:
        if model.get("task") == "text-classification":
            return model["id"], {"input_data": "a wonderful little model"}
    for model in models:
        if model.get("framework") == "triton":
            return model["id"], {"input_data": [[5.1, 3.5, 1.4, 0.2]]}
    model = models[0] if models else {"id": "MODEL"}
    return model["id"], {"input_data": [1.0, 2.0]}


def generative_model(model_store: Path) -> str | None:
    """A text-generation model the store names, for the OpenAI example (None when there is none)."""
    models = json.loads(model_store.read_text()).get("models", [])
    return next((m["id"] for m in models if m.get("task") == "text-generation"), None)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("HOTSET_ROUTER_PORT", "8080")))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("HOTSET_ROUTER_GRPC_PORT", "8081")),
                        help="the router's OIP v2 over gRPC port")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-budget", default="2Gi")
    parser.add_argument("--model-store", type=Path, default=ROOT / "build/models/model-store.json")
    parser.add_argument("--no-triton", action="store_true", help="start workers without Triton sidecars")
    args = parser.parse_args(argv)
    if not args.model_store.exists():
        raise SystemExit(f"{args.model_store} is missing: run `.venv/bin/hotset-samples --out build/models` first")
    print(f"starting router on 127.0.0.1:{args.port} and {args.workers} workers (logs in build/stack/logs) ...", flush=True)
    stack = start_stack(args.model_store, args.workers, args.port, not args.no_triton, args.memory_budget,
                        grpc_port=args.grpc_port)
    stop_requested = False

    def request_stop(*_: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    model, body = example_request(args.model_store)
    url = stack.router.url
    print(f"\nhotset is ready: router {url}, OIP v2 over gRPC on 127.0.0.1:{args.grpc_port}")
    for worker, sidecar in zip(stack.workers, stack.sidecars or [None] * len(stack.workers)):
        print(f"  {worker.name}: {worker.url} (pid {worker.pid})" + (f", triton {sidecar.url} (pid {sidecar.pid})" if sidecar else ""))
    print("\ntry:")
    print(f"  curl -s {url}/models")
    print(f"  curl -s -X POST {url}/predict -H 'content-type: application/json' -d '{json.dumps({'model_id': model, **body})}'")
    print(f"  curl -s {url}/v2/models/{model}")
    chat_model = generative_model(args.model_store)
    if chat_model:
        chat = {"model": chat_model, "messages": [{"role": "user", "content": "say hello"}], "temperature": 0, "stream": True}
        print(f"  curl -sN {url}/v1/chat/completions -H 'content-type: application/json' -d '{json.dumps(chat)}'")
        print(f"  .venv/bin/python -c 'from openai import OpenAI; print(OpenAI(base_url=\"{url}/v1\", api_key=\"-\")"
              f".chat.completions.create(model=\"{chat_model}\", messages=[{{\"role\": \"user\", "
              f"\"content\": \"what color is the sky?\"}}], temperature=0).choices[0].message.content)'")
    print("\nCtrl-C stops every process started here.", flush=True)
    try:
        while not stop_requested:
            dead = [p for p in stack.processes if not p.alive()]
            if dead:
                print(f"{dead[0].name} exited unexpectedly:\n{dead[0].log_tail()}", file=sys.stderr)
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("\nstopping ...", flush=True)
        stack.stop()


if __name__ == "__main__":
    main()
