#!/usr/bin/env python3
"""A load step from 1x to 4x the pool's capacity: the pool grows to fit, no request fails, and it
returns to its minimum afterwards; pods used against the bin-packing lower bound throughout.

What runs for real: kube-apiserver, kube-controller-manager and kube-scheduler (the test control
plane), the ``hotset-operator`` and ``hotset-router`` commands, and one real
``hotset-worker`` process per pod (ballast models: exact sizes, 1 s loads, 50 ms predictions).
What is simulated: the kubelet (``tests/hotset_testing/pod_player.py`` starts a pod's worker
process as soon as the scheduler binds it, on a loopback address of its own), so a pod's start is
the worker process's own start, with no image pull or container runtime (``--pod-start-delay``
adds a fixed delay for those).

The pool's capacity: one pod (the minimum) holds 2 models of 45 MiB in its 100 MiB budget. At 1x,
4 clients keep requests in flight for 2 models; at 4x, 16 clients over 8 models (4x the bytes and
4x the concurrency). The lower bound at any moment is max(minimum, ceil(bytes of the models
requested within their idleSeconds / budget)): no pool holding them all uses fewer pods.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hotset_testing import kube_cluster  # noqa: E402
from hotset_testing.scaling_stack import MiB, ScalingStack, served_model, write_ballast  # noqa: E402

MODEL_MIB = 45
BUDGET_MIB = 100
IDLE_S = 10


class Load:
    """Closed-loop clients, each sending one request at a time for its model, counting every answer."""

    def __init__(self, stack: ScalingStack) -> None:
        self.stack = stack
        self.ok = 0
        self.failed: list[str] = []
        self.last_request: dict[str, float] = {}  # model -> when its last request ended
        self.inflight: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def add_clients(self, models: list[str], clients_per_model: int) -> None:
        for model in models:
            for _ in range(clients_per_model):
                thread = threading.Thread(target=self._client, args=(model,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _client(self, model: str) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                with self._lock:
                    self.inflight[model] = self.inflight.get(model, 0) + 1
                try:
                    answer = self.stack.predict(client, model, timeout_s=60)
                    status = str(answer.status_code) if answer.status_code != 200 else ""
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with self._lock:
                    self.inflight[model] -= 1
                    self.last_request[model] = time.monotonic()
                    if status:
                        self.failed.append(f"{model}: {status}")
                    else:
                        self.ok += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)

    def wanted(self, now: float) -> list[str]:
        """Models with a request in flight or one answered within their idleSeconds."""
        with self._lock:
            return [m for m in set(self.inflight) | set(self.last_request)
                    if self.inflight.get(m, 0) or now - self.last_request.get(m, -1e9) < IDLE_S]


def pods_used(stack: ScalingStack) -> int:
    """Pool pods that exist (starting, running or draining), as the cluster sees them."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(stack.kube.kubeconfig))
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(stack.namespace, label_selector="hotset.io/pool=shared").items
        return sum(1 for p in pods if p.metadata.deletion_timestamp is None)
    finally:
        api.close()


def lower_bound(models: int) -> int:
    return max(1, math.ceil(models * MODEL_MIB / BUDGET_MIB))


def served_requests(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "hotset_requests_total" and s.labels.get("code") == "200")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    crds = sorted((ROOT / "crds").glob("*.yaml"))
    settings = {"pool_min_pods": 1, "pool_max_pods": 8, "pod_memory_budget": f"{BUDGET_MIB}Mi",
                "scale_down_delay_s": args.scale_down_delay, "queue_wait_s": 0.5, "drain_timeout_s": 30}
    with kube_cluster.running(workdir / "kube", manifests=crds) as kube:
        kube.kubectl("create", "namespace", "bench")
        with ScalingStack(kube, "bench", workdir, settings, start_delay_s=args.pod_start_delay) as stack:
            models = [f"m{i}" for i in range(8)]
            for name in models:
                write_ballast(stack.models, name, MODEL_MIB, load_delay_s=1.0, predict_delay_s=0.05)
                stack.apply(served_model(name, MODEL_MIB, max_copies=1, idle_s=IDLE_S))
            stack.wait_for(lambda: len(stack.player.running()) == 1, "the pool's minimum pod", 120)
            samples: list[tuple[float, str, int, int]] = []  # (time, phase, pods used, lower bound)
            load = Load(stack)
            phase = ["1x"]
            stop_sampling = threading.Event()

            def sample() -> None:
                while not stop_sampling.wait(0.5):
                    now = time.monotonic()
                    samples.append((now, phase[0], pods_used(stack), lower_bound(len(load.wanted(now)))))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            initial = set(stack.player.running())
            load.add_clients(models[:2], 2)  # 1x: 2 models (one pod's bytes), 4 clients
            time.sleep(args.phase_s)
            step_at = time.monotonic()
            phase[0] = "4x"
            load.add_clients(models[2:], 2)  # 4x: 8 models, 16 clients
            first_new_serving = None
            while time.monotonic() - step_at < args.phase_s or first_new_serving is None:
                for pod in set(stack.player.running()) - initial:
                    try:
                        if served_requests(stack.player.url_of(pod)) > 0:
                            first_new_serving = first_new_serving or time.monotonic() - step_at
                    except (httpx.HTTPError, StopIteration):
                        pass
                if time.monotonic() - step_at > 300:
                    break
                time.sleep(0.25)
            peak = max(p for _, ph, p, _ in samples if ph == "4x")
            load.stop()
            end_at = time.monotonic()
            phase[0] = "after"
            stack.wait_for(lambda: pods_used(stack) == 1 and stack.replicas("hotset-pool") == 1,
                           "the pool back at its minimum", timeout=300)
            back_at = time.monotonic()
            stop_sampling.set()
            sampler.join(5)
    during = [(p, lb) for _, ph, p, lb in samples if ph in ("1x", "4x")]
    # The lower bound over the scale-down window: the largest in the last scaleDownDelay seconds (+ 5 s
    # for drains), i.e. what the autoscaler may still hold pods for by design.
    window = args.scale_down_delay + 5
    held = [(p, max(lb2 for t2, _, _, lb2 in samples if t - window <= t2 <= t)) for t, _, p, _ in samples]
    after = [(p, lb) for t, ph, p, lb in samples if ph == "after"]
    settle = [(p, lb) for t, ph, p, lb in samples if ph == "4x" and t - step_at > 30]
    return {
        "requests ok": load.ok,
        "requests failed": len(load.failed),
        "failed examples": "; ".join(load.failed[:3]),
        "step to first new copy serving (s)": round(first_new_serving or float("nan"), 1),
        "pods at 1x / 4x peak": f"{max(p for _, ph, p, _ in samples if ph == '1x')} / {peak}",
        "lower bound at 1x / 4x": f"{lower_bound(2)} / {lower_bound(8)}",
        "max pods / lower bound while the load runs": round(max(p / lb for p, lb in during), 2),
        "median pods / lower bound once grown (4x, after 30 s)": round(statistics.median(p / lb for p, lb in settle), 2)
        if settle else float("nan"),
        "load end to pool back at its minimum (s)": round(back_at - end_at, 1),
        "max pods / lower bound after the load (models still within idleSeconds, then the scale-down delay)":
            round(max(p / lb for p, lb in after), 2) if after else float("nan"),
        f"max pods / lower bound over the scale-down window ({window:g} s), whole run": round(max(p / lb for p, lb in held), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=45.0, help="seconds of 1x, then at least as long of 4x")
    parser.add_argument("--pod-start-delay", type=float, default=0.0, help="seconds added to each pod's start")
    parser.add_argument("--scale-down-delay", type=float, default=10.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="pool-autoscaling-"))
    try:
        figures = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # the control plane's data and the processes' logs
    print(f"pool autoscaling, 1x -> 4x step (idleSeconds {IDLE_S}, scale-down delay {args.scale_down_delay:g} s, "
          f"pod start delay {args.pod_start_delay:g} s):")
    for name, value in figures.items():
        print(f"  {name}: {value}")


if __name__ == "__main__":
    main()
