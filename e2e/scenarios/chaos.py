"""Chaos under load on an e2e platform: a constant stream of requests for a model with two copies
(a dedicated group of two pods) while, in turn, a worker container, a Triton sidecar, the router
and the operator are killed (SIGKILL through ``Platform.kill_container``) and restarted by the
kubelet. Per event: requests during it, the failed ones, how long the
failure was visible (kill to last failed request) and how long until both copies were Ready again.

A benchmark, not a pass/fail scenario: e2e/kind/test_chaos_under_load.py runs it when
HOTSET_CHAOS=1 and prints the table (docs/reliability.md).
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import httpx

from scenarios.platform import Kube, Platform, is_true, sample, wait_for
from scenarios.served_models import router_sees_ready

MODEL = "chaos-sentiment"
SELECTOR = f"app.kubernetes.io/component=worker,hotset.io/servedmodel={MODEL}"


class Stream:
    """`rps` requests a second to whatever router the platform names now (re-read every second)."""

    def __init__(self, platform: Platform, rps: float) -> None:
        self.platform = platform
        self.rps = rps
        self.results: list[tuple[float, bool, str]] = []
        self.stop = threading.Event()
        self.url = platform.router_url

    def _follow_router(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.url = self.platform.router_url
            except Exception:  # noqa: BLE001 - no Ready router right now: keep the last one
                pass

    def _one(self, client: httpx.Client) -> None:
        sent = time.monotonic()
        try:
            answer = client.post(self.url + "/predict", json={"model_id": MODEL, "input_data": "a wonderful little model"})
            self.results.append((sent, answer.status_code == 200, str(answer.status_code)))
        except httpx.HTTPError as exc:
            self.results.append((sent, False, type(exc).__name__))

    def run(self) -> None:
        threading.Thread(target=self._follow_router, daemon=True).start()
        with httpx.Client(timeout=15, headers=self.platform.router_headers) as client, concurrent.futures.ThreadPoolExecutor(16) as pool:
            while not self.stop.is_set():
                pool.submit(self._one, client)
                time.sleep(1 / self.rps)


def _pod_of(kube: Kube, selector: str) -> str:
    return next(p["metadata"]["name"] for p in kube.items("pods", "-l", selector) if is_true(p, "Ready"))


def _both_copies_ready(platform: Platform, kube: Kube) -> bool:
    pods = kube.worker_pods(SELECTOR)
    return len(pods) == 2 and all(is_true(p, "Ready") for p in pods) and \
        all(router_sees_ready(platform, p["metadata"]["name"]) for p in pods)


def chaos_under_load(platform: Platform, kube: Kube, rps: float = 10.0, settle_s: float = 5.0) -> list[dict[str, Any]]:
    body = sample("sentiment")
    body["metadata"]["name"] = MODEL
    body["spec"].update(placement="dedicated", replicas={"min": 2, "max": 2})
    kube.apply([body])
    wait_for("two Ready copies", lambda: _both_copies_ready(platform, kube), 300, interval=1.0)
    stream = Stream(platform, rps)
    runner = threading.Thread(target=stream.run)
    runner.start()
    rows = []
    try:
        time.sleep(settle_s)
        pods = sorted(p["metadata"]["name"] for p in kube.worker_pods(SELECTOR))
        events = [("worker container", pods[0], "hotset-worker"), ("Triton sidecar", pods[1], "triton"),
                  ("router", _pod_of(kube, "app.kubernetes.io/component=router"), "router"),
                  ("operator", _pod_of(kube, "app.kubernetes.io/component=operator"), "operator")]
        for what, pod, container in events:
            killed_at = time.monotonic()
            platform.kill_container(pod, container)
            time.sleep(2.0)  # let the kill be seen before asking whether all is well again
            wait_for(f"two Ready copies after the {what} was killed", lambda: _both_copies_ready(platform, kube), 300, interval=1.0)
            if container == "operator":
                wait_for("the operator Ready again", lambda: _pod_of(kube, "app.kubernetes.io/component=operator"), 120)
            recovered = time.monotonic() - killed_at
            time.sleep(settle_s)
            window = [r for r in stream.results if r[0] >= killed_at]
            failed = [r for r in window if not r[1]]
            rows.append({"killed": what, "requests": len(window), "failed": len(failed),
                         "failures": sorted({r[2] for r in failed}),
                         "visible_s": round(max((r[0] for r in failed), default=killed_at) - killed_at, 2),
                         "ready_again_s": round(recovered, 1)})
    finally:
        stream.stop.set()
        runner.join()
        kube.delete("servedmodel", MODEL)
    return rows
