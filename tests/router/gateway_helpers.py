"""Helpers of the router's tests: real worker and router processes, model stores, and what they report.

A module of its own (not conftest.py) so test modules import it by a name no other suite uses.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import local_stack  # noqa: E402
from hotset_testing.polling import wait_for  # noqa: E402,F401 - the router tests import it from here
from hotset_testing import scrape  # noqa: E402

MiB = 2**20
BALLAST_LAUNCHER = [sys.executable, str(Path(__file__).with_name("ballast_worker_main.py"))]


def write_ballast_store(folder: Path, models: dict[str, dict[str, Any]]) -> Path:
    """Ballast model folders and a model store: ``{"a": {"mib": 20, "delay": 0.5, "predict_delay": 0.1, "max": 2, "min": 0}}``."""
    entries = []
    for model_id, options in models.items():
        size = int(options.get("mib", 1) * MiB)
        path = folder / model_id
        path.mkdir(parents=True, exist_ok=True)
        (path / "ballast.json").write_text(json.dumps({"bytes": size, "load_delay_s": options.get("delay", 0.0), "factor": 2.0,
                                                       "predict_delay_s": options.get("predict_delay", 0.0)}))
        entries.append({
            "id": model_id, "framework": "torchvision", "task": "tensor", "source": f"file://{path}",
            "memory": size, "replicas": {"min": options.get("min", 0), "max": options.get("max", 1)},
        })
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": entries}))
    return store


def worker_metric(url: str, name: str, **labels: str) -> float:
    """Sum of a worker's Prometheus samples `name` whose labels include `labels`."""
    return scrape.metric(url, name, **labels)


def loads(url: str, model: str) -> float:
    """Successful loads of `model` on the worker at `url`, from its own metrics."""
    return worker_metric(url, "hotset_model_loads_total", model=model, result="success")


def worker_models(url: str) -> dict[str, str]:
    """model id -> state, from the worker's own /status."""
    return {c["id"]: c["state"] for c in httpx.get(f"{url}/status", timeout=5).json()["models"]}


def copies(router_url: str, model: str) -> list[str]:
    """Pods with a READY copy of `model`, per the router's GET /models."""
    report = httpx.get(f"{router_url}/models", timeout=5).json()
    return sorted(c["pod"] for c in report["copies"].get(model, []) if c["state"] == "READY")


class Processes:
    """Starts workers and routers for one test and stops them all (by pid) afterwards."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[local_stack.Process] = []

    def worker(self, name: str, store: Path, budget: str, extra: list[str] | None = None) -> local_stack.Process:
        process = local_stack.start_worker(name, store, self.log_dir, budget, extra_args=["--min-residency-s", "0", *(extra or [])],
                                           launcher=BALLAST_LAUNCHER)
        self.started.append(process)
        local_stack.wait_http(process, "/v2/health/ready", 90)
        return process

    def workers(self, store: Path, budgets: list[str], extra: list[str] | None = None) -> list[local_stack.Process]:
        """Start several workers at once (their start-up overlaps), then wait for each."""
        started = []
        for i, budget in enumerate(budgets):
            process = local_stack.start_worker(f"worker-{i + 1}", store, self.log_dir, budget,
                                               extra_args=["--min-residency-s", "0", *(extra or [])],
                                               launcher=BALLAST_LAUNCHER)
            self.started.append(process)
            started.append(process)
        for process in started:
            local_stack.wait_http(process, "/v2/health/ready", 90)
        return started

    def router(self, workers: list[local_stack.Process], store: Path | None = None, args: list[str] | None = None,
               urls: list[str] | None = None, wait_ready: bool = True) -> local_stack.Process:
        base = ["--sync-interval", "0.2", "--churn-guard-seconds", "0", "--log-level", "info"]
        process = local_stack.start_router(urls or [w.url for w in workers], self.log_dir, model_store=store,
                                           extra_args=[*base, *(args or [])])
        self.started.append(process)
        local_stack.wait_http(process, "/v2/health/ready" if wait_ready else "/v2/health/live", 60)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.started):
            process.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.log_tail(30)}" for p in self.started)
