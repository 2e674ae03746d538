"""Run every benchmark in turn and print their figures (`make bench`).

Each script is a separate process so one benchmark's servers and memory never
colour the next one's figures.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS: list[list[str]] = [
    ["worker_under_thrash.py"],
    ["worker_closed_loop.py"],  # the same workload, a second harness (docs/benchmarks.md says why they differ)
    ["worker_batching.py"],
    ["lone_request.py"],  # a lone request, batching on against off, in one process (docs/benchmarks.md)
    ["lone_request.py", "--load-order", "off,on"],
    ["lone_request.py", "--stand-in"],
    ["worker_eviction_pause.py"],
    ["worker_overload.py"],
    ["router_load_seconds.py"],
    ["worker_cold_warm.py"],
    ["model_sources.py"],
    ["worker_head_of_line.py"],
    ["router_overhead.py"],
    ["router_callers.py"],  # what checking callers adds per request (docs/benchmarks.md)
    # Scale in models (docs/benchmarks.md): the router at 50 pods x 10,000 models.
    ["router_scale_models.py"],
    ["router_scale_functions.py"],
    ["router_placement_density.py"],
    ["router_cold_start.py", "--real"],
    ["llm_streaming.py"],
    ["llm_real_engine_ttft.py"],  # the same on a real vLLM engine (needs scripts/install-vllm.sh)
    ["llm_prefix_routing.py"],  # prefix-aware vs random routing on two real engines (the same)
    ["pool_autoscaling.py"],
    # Scale in models (docs/benchmarks.md): the operator and its catalog with 1,000-10,000 ServedModels,
    # and worker density.
    ["operator_scale.py"],
    ["worker_density.py"],
    ["worker_metrics_bound.py", "--models", "10000"],
    # Reliability (docs/reliability.md): hostile inputs, chaos under load, the 10-minute soak.
    ["hostile_inputs.py"],
    ["chaos.py"],
    ["soak.py", "--minutes", "10"],
]


def main() -> int:
    failed: list[str] = []
    for script, *args in BENCHMARKS:
        print(f"\n=== {script} {' '.join(args)}", flush=True)
        result = subprocess.run([sys.executable, str(HERE / script), *args])
        if result.returncode != 0:
            failed.append(script)
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
