"""The issue's scenarios, in the order one platform goes through them.

Each function is one scenario: it acts as a user (kubectl apply/delete, HTTP
to the router) and asserts what a user would see (predictions, ServedModel
status, the router's ``GET /models``), plus the pods' own reports where the
scenario is about them. Both tiers call these from their test files.

The order matters and is the tiers' test order: the shared pool starts with
one pod whose memory budget fits two of the three sample models (scenarios 1
and 2), a dedicated group comes and goes (3), then the pool grows to two pods
for replication and failure scenarios (4-6), and the catalog shrinks (7, 8).
"""
from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from scenarios.inputs import check_predictions, payload, predict
from scenarios.platform import Kube, Platform, condition, is_true, sample, wait_for

MODELS = ["sentiment", "colors", "iris"]
WORKER_CONTAINER = "modelplane-worker"
TRITON_CONTAINER = "triton"
POOL_SELECTOR = "app.kubernetes.io/component=worker,modelplane.io/pool=shared"


# -- what the router and the cluster say ----------------------------------------------------------
def router_models(platform: Platform) -> dict[str, Any]:
    answer = httpx.get(f"{platform.router_url}/models", timeout=10)
    answer.raise_for_status()
    return answer.json()


def router_pods(platform: Platform) -> list[dict[str, Any]]:
    answer = httpx.get(f"{platform.router_url}/router/pods", timeout=10)
    answer.raise_for_status()
    return answer.json()


def ready_copies(report: dict[str, Any], model: str) -> set[str]:
    """Pods where the router has a READY copy of the model."""
    return {c["pod"] for c in report.get("copies", {}).get(model, []) if c["state"] == "READY"}


def status_copies(kube: Kube, model: str) -> set[str]:
    """Pods the ServedModel's status lists as holding a loaded copy."""
    copies = (kube.served_model(model).get("status") or {}).get("copies") or []
    return {c["pod"] for c in copies if str(c.get("state", "")).lower() in ("loaded", "ready")}


# A new shared-pool ServedModel reaches the pool's pods through the model-store ConfigMap
# volume, which the kubelet refreshes on its periodic pod sync (syncFrequency, 1 min by
# default, plus its cache): up to about 90 s after `kubectl apply` (docs/e2e.md).
CATALOG_PROPAGATION_S = 150.0


def predict_ok(platform: Platform, model: str, settle_s: float = CATALOG_PROPAGATION_S) -> httpx.Response:
    """The first request may race the pods learning of a new ServedModel (404): retry those only."""
    def attempt() -> httpx.Response | None:
        answer = predict(platform.router_url, model)
        return None if answer.status_code == 404 else answer

    answer = wait_for(f"the router to know {model}", attempt, settle_s, interval=1.0)
    check_predictions(model, answer)
    return answer


def pod_ready(kube: Kube, name: str) -> bool:
    pods = kube.items("pods", "--field-selector", f"metadata.name={name}")
    return bool(pods) and is_true(pods[0], "Ready")


def restart_count(kube: Kube, pod: str, container: str) -> int:
    status = kube.get("pod", pod)["status"]
    return next(c["restartCount"] for c in status.get("containerStatuses", []) if c["name"] == container)


def router_sees_ready(platform: Platform, pod: str) -> bool:
    return any(p["pod"] == pod and p["ready"] for p in router_pods(platform))


def worker_token(platform: Platform) -> str:
    """The workers' API token, read from its Secret as a cluster admin would (docs/security.md)."""
    import base64

    secret = json.loads(platform.kubectl.kubectl("get", "secret", "modelplane-worker-token", "-n", platform.namespace,
                                                 "-o", "json").stdout)
    return base64.b64decode(secret["data"]["token"]).decode()


def worker_status(platform: Platform, pod: str) -> dict[str, Any]:
    answer = httpx.get(f"{platform.worker_url(pod)}/status", timeout=10,
                       headers={"Authorization": f"Bearer {worker_token(platform)}"})
    answer.raise_for_status()
    return answer.json()


def worker_requests(platform: Platform, pod: str, model: str) -> float:
    """modelplane_requests_total for one model on one pod, from the pod's /metrics."""
    text = httpx.get(f"{platform.worker_url(pod)}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            if metric.name == "modelplane_requests_total" and metric.labels.get("model") == model:
                total += metric.value
    return total


# -- 1 ------------------------------------------------------------------------------------------
def three_frameworks_served(platform: Platform, kube: Kube) -> None:
    """kubectl apply three ServedModels; each is served through the router and shows Ready with its copy."""
    kube.apply([sample(m) for m in MODELS])
    for model in MODELS:
        wait_for(f"{model} Accepted", lambda: is_true(kube.served_model(model), "Accepted"), 60)
    for model in MODELS:
        predict_ok(platform, model)
        wait_for(f"{model} Ready with its copy in kubectl get servedmodels",
                 lambda: is_true(kube.served_model(model), "Ready") and status_copies(kube, model), 90)
    table = platform.kubectl.kubectl("get", "servedmodels", "-n", platform.namespace).stdout
    for model in MODELS:
        assert model in table, table


# -- 2 ------------------------------------------------------------------------------------------
def lru_budget(sizes: dict[str, int]) -> tuple[int, int]:
    """Budgets that hold sentiment + iris but not colors as well: [low, high)."""
    low = sizes["sentiment"] + sizes["iris"]
    return low, low + sizes["colors"]


def ensure_lru_budget(platform: Platform, kube: Kube) -> None:
    """Re-size the pool's budget when the measured sizes (scenario 1 loaded each model) miss the tier's value.

    Triton models are measured by their stub's RSS, which differs between this
    machine's Triton and the official image, so the values file is a first guess.
    """
    (pod,) = [p["metadata"]["name"] for p in kube.worker_pods(POOL_SELECTOR)]
    status = worker_status(platform, pod)
    sizes = {entry["id"]: entry["memory_bytes"] for entry in status["catalog"]}
    low, high = lru_budget(sizes)
    if low <= status["memory_budget_bytes"] < high:
        return
    platform.set_memory_budget((low + high) // 2)

    def resized() -> bool:
        pods = kube.worker_pods(POOL_SELECTOR)
        return len(pods) == 1 and is_true(pods[0], "Ready") and router_sees_ready(platform, pods[0]["metadata"]["name"]) \
            and low <= worker_status(platform, pods[0]["metadata"]["name"])["memory_budget_bytes"] < high

    wait_for("the pool pod with the re-sized budget", resized, 300, interval=1.0)


def least_recently_used_evicted(platform: Platform, kube: Kube) -> None:
    """One pool pod whose budget holds sentiment + iris but not all three: using colors, sentiment, iris
    in that order evicts colors, the least recently used (the tier's values.yaml sizes the budget)."""
    ensure_lru_budget(platform, kube)
    order = ["colors", "sentiment", "iris"]
    for model in order:
        predict_ok(platform, model)

    def settled() -> dict[str, Any] | None:
        report = router_models(platform)
        kept = ready_copies(report, "sentiment") and ready_copies(report, "iris")
        return report if kept and not ready_copies(report, "colors") else None

    report = wait_for("the router's map: sentiment and iris loaded, colors evicted", settled, 60,
                      show=lambda: router_pods(platform))
    assert ready_copies(report, "sentiment") == ready_copies(report, "iris"), report["copies"]
    for model in order:
        wait_for(f"{model}'s status copies to agree with the router's GET /models",
                 lambda: status_copies(kube, model) == ready_copies(router_models(platform), model), 60,
                 show=lambda: (status_copies(kube, model), router_models(platform)["copies"]))


# -- 3 ------------------------------------------------------------------------------------------
def dedicated_group_of_two(platform: Platform, kube: Kube) -> None:
    """placement: dedicated, replicas.min 2: two pods, Ready only once the model is loaded; traffic reaches both."""
    model = "sentiment-dedicated"
    body = sample("sentiment")
    body["metadata"]["name"] = model
    body["spec"].update(placement="dedicated", replicas={"min": 2, "max": 2})
    kube.apply([body])
    selector = f"app.kubernetes.io/component=worker,modelplane.io/servedmodel={model}"
    wait_for("two dedicated pods", lambda: len(kube.worker_pods(selector)) == 2, 90)

    def both_ready_and_loaded() -> bool:
        pods = kube.worker_pods(selector)
        for pod in pods:
            if is_true(pod, "Ready"):  # a Ready pod must already hold the model, loaded
                copies = {c["id"]: c["state"] for c in worker_status(platform, pod["metadata"]["name"])["models"]}
                assert copies.get(model) == "READY", f"{pod['metadata']['name']} Ready before {model} loaded: {copies}"
        return len(pods) == 2 and all(is_true(p, "Ready") for p in pods)

    wait_for("both dedicated pods Ready", both_ready_and_loaded, 240, interval=0.5)
    pods = [p["metadata"]["name"] for p in kube.worker_pods(selector)]
    wait_for("the router to see both dedicated pods", lambda: all(router_sees_ready(platform, p) for p in pods), 60)
    before = {p: worker_requests(platform, p, model) for p in pods}
    for _ in range(24):
        check_predictions(model, predict(platform.router_url, model))
    served = {p: worker_requests(platform, p, model) - before[p] for p in pods}
    assert all(count > 0 for count in served.values()), f"requests per dedicated pod: {served}"
    wait_for(f"{model} Ready with two copies", lambda: len(status_copies(kube, model)) == 2, 60)
    kube.delete("servedmodel", model)
    wait_for("the dedicated group gone", lambda: not kube.worker_pods(selector), 120)


# -- 3b -----------------------------------------------------------------------------------------
def dedicated_group_scales_to_zero(platform: Platform, kube: Kube) -> None:
    """placement: dedicated, replicas.min 0: no pod while idle; the first request waits while a real pod
    starts (the kubelet pulls nothing, starts both containers, the startup probe waits for the pinned
    load) and is served; once idle for replicas.idleSeconds the group is back to zero pods."""
    model = "sentiment-on-demand"
    body = sample("sentiment")
    body["metadata"]["name"] = model
    body["spec"].update(placement="dedicated", replicas={"min": 0, "max": 1, "idleSeconds": 20})
    kube.apply([body])
    selector = f"app.kubernetes.io/component=worker,modelplane.io/servedmodel={model}"

    def replicas() -> int | None:
        found = kube.items("deployments", "-l", selector)
        return found[0]["spec"].get("replicas") if found else None

    wait_for("the dedicated group created with no pod", lambda: replicas() == 0 and not kube.worker_pods(selector), 90)
    started = time.monotonic()
    answer = predict(platform.router_url, model, timeout=300)
    waited = time.monotonic() - started
    check_predictions(model, answer)
    assert len(kube.worker_pods(selector)) == 1, "the request was served by the pod it asked for"
    metrics = httpx.get(f"{platform.router_url}/metrics", timeout=10).text
    held = [s for f in text_string_to_metric_families(metrics) for s in f.samples
            if s.name == "modelplane_router_pod_waits_total" and s.labels.get("model") == model]
    assert [(s.labels["result"], s.value) for s in held] == [("served", 1.0)], held
    print(f"scale from zero: the first request waited {waited:.1f} s for a pod and was served")
    wait_for("the group back to zero pods once idle", lambda: replicas() == 0 and not kube.worker_pods(selector), 240,
             interval=1.0)
    kube.delete("servedmodel", model)


# -- 4 ------------------------------------------------------------------------------------------
def hot_model_gets_another_copy(platform: Platform, kube: Kube) -> None:
    """Sustained load on one model adds a copy on another pod."""
    platform.set_pool_size(2)
    def two_ready() -> list[str] | None:
        pods = kube.worker_pods(POOL_SELECTOR)
        return [p["metadata"]["name"] for p in pods] if len(pods) == 2 and all(is_true(p, "Ready") for p in pods) else None

    pool = wait_for("two Ready pool pods", two_ready, 300)
    wait_for("the router to see both pool pods", lambda: all(router_sees_ready(platform, p) for p in pool), 120)
    model = "colors"
    predict_ok(platform, model)
    stop = threading.Event()
    failures: list[str] = []

    def load() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                answer = client.post(f"{platform.router_url}/predict",
                                     json={"model_id": model, "input_data": payload(model)})
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")

    with concurrent.futures.ThreadPoolExecutor(4) as pool_threads:
        for _ in range(4):
            pool_threads.submit(load)
        try:
            wait_for(f"a second READY copy of {model} on another pod",
                     lambda: len(ready_copies(router_models(platform), model)) >= 2, 120, interval=1.0)
        finally:
            stop.set()
    assert not failures, failures[:5]
    wait_for(f"{model}'s status to list both copies", lambda: len(status_copies(kube, model)) >= 2, 60)


# -- 5 ------------------------------------------------------------------------------------------
def killed_worker_leaves_and_returns(platform: Platform, kube: Kube) -> None:
    """Kill a worker container: its pod goes unready and leaves the router; a model with another copy keeps serving."""
    model = "colors"
    holders = sorted(ready_copies(router_models(platform), model))
    assert len(holders) >= 2, f"{model} needs two copies for this scenario (from the hot-model scenario): {holders}"
    victim = holders[0]
    restarts = restart_count(kube, victim, WORKER_CONTAINER)
    platform.kill_container(victim, WORKER_CONTAINER)
    results: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        results.append(predict(platform.router_url, model).status_code)
        if not pod_ready(kube, victim) and not router_sees_ready(platform, victim):
            break
    else:
        raise AssertionError(f"{victim} still Ready or still in the router's map 90 s after its worker was killed")
    for _ in range(5):
        results.append(predict(platform.router_url, model).status_code)
    assert all(code == 200 for code in results), f"requests to {model} while {victim} was down: {results}"
    wait_for(f"{victim} Ready again after its worker restarted", lambda: pod_ready(kube, victim), 180)
    assert restart_count(kube, victim, WORKER_CONTAINER) > restarts
    wait_for(f"the router to take {victim} back", lambda: router_sees_ready(platform, victim), 60)


# -- 6 ------------------------------------------------------------------------------------------
def killed_triton_sidecar(platform: Platform, kube: Kube) -> None:
    """Kill a Triton sidecar: that pod leaves the router's map until Triton is back; other pods keep serving."""
    predict_ok(platform, "iris")
    holder = sorted(ready_copies(router_models(platform), "iris"))[0]
    others = [p["pod"] for p in router_pods(platform) if p["pod"] != holder and p["ready"]]
    bystander = next((m for m in ("colors", "sentiment") if ready_copies(router_models(platform), m) & set(others)), "colors")
    platform.kill_container(holder, TRITON_CONTAINER)
    wait_for(f"{holder} out of the router's map while its Triton is down",
             lambda: not router_sees_ready(platform, holder), 90, interval=0.5)
    # Triton drains for a while after SIGTERM before it exits: the kubelet then restarts it
    # (or, first, the pod's readiness probe fails).
    wait_for(f"the kubelet to see {holder}'s Triton down (unready or restarted)",
             lambda: not pod_ready(kube, holder) or restart_count(kube, holder, TRITON_CONTAINER) > 0, 90)
    for _ in range(5):
        check_predictions(bystander, predict(platform.router_url, bystander))
    wait_for(f"{holder} Ready again with Triton back", lambda: pod_ready(kube, holder), 180)
    wait_for(f"the router to take {holder} back", lambda: router_sees_ready(platform, holder), 60)
    predict_ok(platform, "iris")


# -- 7 ------------------------------------------------------------------------------------------
def deleted_model_unloaded(platform: Platform, kube: Kube) -> None:
    """Delete a ServedModel: its copies are unloaded and it leaves GET /models."""
    predict_ok(platform, "iris")
    holders = ready_copies(router_models(platform), "iris")
    kube.delete("servedmodel", "iris")
    wait_for("the iris ServedModel gone (finalizer done)", lambda: not kube.items("servedmodels", "--field-selector", "metadata.name=iris"), 120)
    wait_for("iris out of the router's GET /models",
             lambda: "iris" not in router_models(platform)["available_models"] and not router_models(platform).get("copies", {}).get("iris"), 60)
    for pod in holders:
        assert "iris" not in {c["id"] for c in worker_status(platform, pod)["models"]}, f"iris still loaded on {pod}"


# -- 8 ------------------------------------------------------------------------------------------
def missing_source_reported(platform: Platform, kube: Kube) -> None:
    """A ServedModel whose source does not exist: its status says why; nothing else is disturbed."""
    restarts = {p["metadata"]["name"]: [c["restartCount"] for c in p["status"]["containerStatuses"]]
                for p in kube.worker_pods()}
    ghost = sample("sentiment")
    ghost["metadata"]["name"] = "ghost"
    ghost["spec"].update(source={"uri": "pvc://models/does-not-exist"}, replicas={"min": 1, "max": 1})
    kube.apply([ghost])

    def explained() -> str | None:
        body = kube.served_model("ghost")
        for kind in ("Ready", "Accepted"):
            entry = condition(body, kind)
            if entry.get("status") == "False" and "does-not-exist" in (entry.get("message") or ""):
                return entry["message"]
        return None

    wait_for("ghost's status to name its missing source", explained, 120)
    answer = predict(platform.router_url, "ghost", like="sentiment")
    assert 400 <= answer.status_code < 600 and "does-not-exist" in answer.text, (answer.status_code, answer.text[:300])
    predict_ok(platform, "colors")
    after = {p["metadata"]["name"]: [c["restartCount"] for c in p["status"]["containerStatuses"]]
             for p in kube.worker_pods()}
    assert after == restarts, f"worker restarts changed: {restarts} -> {after}"
    kube.delete("servedmodel", "ghost")


# -- 9. versions side by side ----------------------------------------------------------------------
def canary_then_promote(platform: Platform, kube: Kube) -> None:
    """Version 1, a 10% canary of version 2, the canary at 100%, then version 2 promoted and version 1
    gone from every pod, with zero failed requests (docs/operator.md, "Versions, canaries")."""
    name = "sentiment-canary"
    body = sample("sentiment")
    body["metadata"]["name"] = name
    kube.apply([body])
    predict_ok(platform, name)
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                answer = client.post(f"{platform.router_url}/predict", json={"model_id": name, "input_data": payload("sentiment")})
                answers.append((answer.status_code, answer.headers.get("x-modelplane-model-version", "")))

    def set_spec(**changes: Any) -> None:
        spec = {**body["spec"], **changes}
        kube.apply([{**body, "spec": {k: v for k, v in spec.items() if v is not None}}])

    canary = {"version": "2", "source": {"uri": "pvc://models/sentiment-v2"}, "weight": 10}
    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        set_spec(rollout={"canary": canary})
        wait_for("a first answer from the canary", lambda: any(v == "2" for _, v in answers), CATALOG_PROPAGATION_S)
        mark = len(answers)
        wait_for("200 answers with the canary at 10%", lambda: len(answers) - mark >= 200, 300)
        share = sum(v == "2" for _, v in answers[mark:mark + 200]) / 200
        assert 0.03 <= share <= 0.2, f"the canary answered {share:.0%} of 200 requests at weight 10"
        set_spec(rollout={"canary": {**canary, "weight": 100}})
        wait_for("the canary answering everything", lambda: len(answers) > 20 and all(v == "2" for _, v in answers[-20:]),
                 CATALOG_PROPAGATION_S)
        set_spec(version="2", source={"uri": "pvc://models/sentiment-v2"}, rollout=None)  # promote

        def version_one_gone() -> bool:
            held = {c["version"] for pod in kube.worker_pods(POOL_SELECTOR)
                    for c in worker_status(platform, pod["metadata"]["name"])["models"] if c["id"].startswith(name)}
            return "1" not in held and len(answers) > 20 and all(v == "2" for _, v in answers[-20:])

        wait_for("version 1 gone from every pod", version_one_gone, CATALOG_PROPAGATION_S)
    finally:
        stop.set()
        thread.join(60)
        kube.delete("servedmodel", name)
    failed = [a for a in answers if a[0] != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:5]}"
