#!/usr/bin/env python3
"""The worker's /metrics with thousands of models held, this tree beside an older one (samples, bytes, render time).

In one process per tree (the older one's ``common`` and ``worker-image``
unpacked from git, first on PYTHONPATH), the tree's own ``WorkerMetrics``
is told what ``--models`` held copies tell it (each: a load, its measured
size, one request with its wait for room, as the manager and the data plane
report them), then its exposition is rendered ``--renders`` times: the
samples it holds (as Prometheus parses them), its bytes, and the render's
wall and thread CPU time (the worker renders on a thread, api.py; the time
is what a scrape costs the pod, and what the GIL is held for meanwhile).

The older tree kept series for every held copy; this one for at most
``--max-model-series`` models by recent use. docs/benchmarks.md, "Worker
density", says which machine ran it.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from baseline_tree import measure_in, unpack

ROOT = Path(__file__).resolve().parents[1]


def measure(models: int, renders: int) -> dict[str, Any]:
    """Runs inside the tree under test."""
    from prometheus_client.parser import text_string_to_metric_families

    from hotset_common.spec import ModelSpec
    from hotset_worker.metrics import WorkerMetrics

    metrics = WorkerMetrics("pod", 2**40)
    for i in range(models):
        spec = ModelSpec(id=f"m-{i:05d}", framework="transformers", source=f"file:///models/m-{i:05d}")
        metrics.copy_added(spec)  # held (an older tree gives held copies series)
        metrics.load_finished(spec, 0.2, True)
        metrics.model_bytes(spec, 2**20)
        metrics.request_started(spec)
        metrics.queue_left(spec, 0.001, "admitted")
        metrics.request_finished(spec, 200, 0.004)
        metrics.request_ended(spec)
    if hasattr(metrics, "before_scrape"):
        metrics.before_scrape()
    walls, cpus = [], []
    for _ in range(renders):
        wall, cpu = time.perf_counter(), time.thread_time()
        body = metrics.exposition()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    samples = sum(len(family.samples) for family in text_string_to_metric_families(body.decode()))
    named = {s.labels.get("model") for family in text_string_to_metric_families(body.decode())
             for s in family.samples} - {None}
    return {"samples": samples, "bytes": len(body), "models_named": len(named),
            "render_s": min(walls), "render_cpu_s": min(cpus)}


PACKAGES = ("common", "worker-image")


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    return measure_in(tree, PACKAGES, __file__, "--models", str(args.models), "--renders", str(args.renders))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=5000, help="copies held, each loaded and served once")
    parser.add_argument("--renders", type=int, default=3, help="renders of the exposition (the best is shown)")
    parser.add_argument("--baseline", default="46c5323", help="the older tree ('': none)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(measure(args.models, args.renders)))
        return 0
    with tempfile.TemporaryDirectory(prefix="worker-metrics-") as tmp:
        trees = [("this tree", ROOT)] + ([(args.baseline, unpack(args.baseline, Path(tmp), *PACKAGES))] if args.baseline else [])
        results = {label: run_tree(tree, args) for label, tree in trees}
    print(f"worker /metrics with {args.models:,} copies held, each loaded and served once "
          f"(best of {args.renders} renders; load average {os.getloadavg()[0]:.1f})")
    labels = list(results)
    print(f"{'':<28}" + "".join(f"{label:>14}" for label in labels))
    for name, key, scale, unit in (("models named", "models_named", 1, ""), ("samples", "samples", 1, ""),
                                   ("bytes", "bytes", 1e-6, " MB"), ("render, wall", "render_s", 1000, " ms"),
                                   ("render, thread CPU", "render_cpu_s", 1000, " ms")):
        cells = "".join(f"{results[label][key] * scale:>11,.1f}{unit:<3}" if scale != 1 else
                        f"{results[label][key]:>14,}" for label in labels)
        print(f"{name:<28}{cells}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
