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
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hotset_operator.workloads import TRITON_CONTAINER, TRITON_PID_FILE, TRITON_RESTART_LINE
from scenarios.inputs import check_predictions, payload, predict
from scenarios.platform import Kube, Platform, condition, is_true, sample, wait_for

MODELS = ["sentiment", "colors", "iris"]
WORKER_CONTAINER = "hotset-worker"
POOL_SELECTOR = "app.kubernetes.io/component=worker,hotset.io/pool=shared"


# -- what the router and the cluster say ----------------------------------------------------------
def router_models(platform: Platform) -> dict[str, Any]:
    answer = httpx.get(f"{platform.router_url}/models", headers=platform.router_headers, timeout=10)
    answer.raise_for_status()
    return answer.json()


def router_pods(platform: Platform) -> list[dict[str, Any]]:
    answer = httpx.get(f"{platform.router_url}/router/pods", headers=platform.router_headers, timeout=10)
    answer.raise_for_status()
    return answer.json()


def ready_copies(report: dict[str, Any], model: str) -> set[str]:
    """Pods where the router has a READY copy of the model."""
    return {c["pod"] for c in report.get("copies", {}).get(model, []) if c["state"] == "READY"}


def status_copies(kube: Kube, model: str) -> set[str]:
    """Pods the ServedModel's status lists as holding a loaded copy."""
    copies = (kube.served_model(model).get("status") or {}).get("copies") or []
    return {c["pod"] for c in copies if str(c.get("state", "")).lower() in ("loaded", "ready")}


# A new shared-pool ServedModel reaches the pool's pods through the operator's catalog feed
# within about a second, and the router through the pods' next report (its sync interval);
# the margin is for a loaded machine (docs/e2e.md).
CATALOG_PROPAGATION_S = 60.0


# A new credentials Secret reaches the pods at the kubelet's next sync of their Secret volume
# (about a minute, docs/operator.md), after the catalog has brought them the model.
CREDENTIALS_PROPAGATION_S = 150.0


def predict_ok(platform: Platform, model: str, settle_s: float = CATALOG_PROPAGATION_S,
               retry_failed_loads: bool = False) -> httpx.Response:
    """The first request may race the pods learning of a new ServedModel (404): retry those only;
    with `retry_failed_loads`, also the loads that fail while the pods wait for their credentials."""
    def attempt() -> httpx.Response | None:
        answer = predict(platform, model)
        if answer.status_code == 404 or (retry_failed_loads and answer.status_code >= 500):
            return None
        return answer

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
    """A token worker pods answer, as a cluster admin makes one: the router's ServiceAccount's, for the
    workers' audience (docs/security.md, "Workers that prove who they are")."""
    return platform.kubectl.kubectl("create", "token", "hotset-router", "-n", platform.namespace, "--audience",
                                    "hotset-worker", "--duration", "10m").stdout.strip()


def worker_status(platform: Platform, pod: str) -> dict[str, Any]:
    answer = httpx.get(f"{platform.worker_url(pod)}/status", timeout=10,
                       headers={"Authorization": f"Bearer {worker_token(platform)}"})
    answer.raise_for_status()
    return answer.json()


def worker_requests(platform: Platform, pod: str, model: str) -> float:
    """hotset_requests_total for one model on one pod, from the pod's /metrics."""
    text = httpx.get(f"{platform.worker_url(pod)}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            if metric.name == "hotset_requests_total" and metric.labels.get("model") == model:
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
    selector = f"app.kubernetes.io/component=worker,hotset.io/servedmodel={model}"
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
        check_predictions(model, predict(platform, model))
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
    selector = f"app.kubernetes.io/component=worker,hotset.io/servedmodel={model}"

    def replicas() -> int | None:
        found = kube.items("deployments", "-l", selector)
        return found[0]["spec"].get("replicas") if found else None

    wait_for("the dedicated group created with no pod", lambda: replicas() == 0 and not kube.worker_pods(selector), 90)
    started = time.monotonic()
    answer = predict(platform, model, timeout=300)
    waited = time.monotonic() - started
    check_predictions(model, answer)
    assert len(kube.worker_pods(selector)) == 1, "the request was served by the pod it asked for"
    metrics = httpx.get(f"{platform.router_url}/metrics", timeout=10).text
    held = [s for f in text_string_to_metric_families(metrics) for s in f.samples
            if s.name == "hotset_router_pod_waits_total" and s.labels.get("model") == model]
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
        with httpx.Client(timeout=60, headers=platform.router_headers) as client:
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
        results.append(predict(platform, model).status_code)
        if not pod_ready(kube, victim) and not router_sees_ready(platform, victim):
            break
    else:
        raise AssertionError(f"{victim} still Ready or still in the router's map 90 s after its worker was killed")
    for _ in range(5):
        results.append(predict(platform, model).status_code)
    assert all(code == 200 for code in results), f"requests to {model} while {victim} was down: {results}"
    wait_for(f"{victim} Ready again after its worker restarted", lambda: pod_ready(kube, victim), 180)
    assert restart_count(kube, victim, WORKER_CONTAINER) > restarts
    wait_for(f"the router to take {victim} back", lambda: router_sees_ready(platform, victim), 60)


# -- 6 ------------------------------------------------------------------------------------------
def triton_back(platform: Platform, pod: str) -> bool:
    """The pod's worker reports its Triton sidecar ready (GET /v2/health/ready's triton_ready)."""
    try:
        return httpx.get(f"{platform.worker_url(pod)}/v2/health/ready", timeout=5).json().get("triton_ready") is True
    except (httpx.HTTPError, ValueError):
        return False


def killed_triton_process(platform: Platform, kube: Kube) -> None:
    """Crash a pod's tritonserver: only its Triton models stop; the pod stays Ready and in the router's
    map, its other models keep serving, and the sidecar's loop starts Triton again in place (no
    container restart), after which iris is served again."""
    predict_ok(platform, "iris")
    holder = sorted(ready_copies(router_models(platform), "iris"))[0]
    report = router_models(platform)
    # a model of another framework on the same pod if it has one (it must keep serving there), else elsewhere
    bystander = next((m for m in ("colors", "sentiment") if holder in ready_copies(report, m)),
                     next(m for m in ("colors", "sentiment") if ready_copies(report, m)))
    restarts = restart_count(kube, holder, TRITON_CONTAINER)
    assert triton_back(platform, holder), f"{holder}'s Triton not ready before the scenario"
    platform.kubectl.kubectl("exec", "-n", platform.namespace, holder, "-c", TRITON_CONTAINER, "--",
                             "sh", "-c", f"kill -KILL $(cat {TRITON_PID_FILE})")

    def triton_logs() -> str:
        return platform.kubectl.kubectl("logs", "-n", platform.namespace, holder, "-c", TRITON_CONTAINER,
                                        check=False).stdout
    wait_for(f"the sidecar's loop on {holder} to see tritonserver exit", lambda: TRITON_RESTART_LINE in triton_logs(), 60)

    # While Triton is down and starting again (watched for at least 15 s, the worker's and router's
    # report cycles): the pod stays Ready and routed, and its other model keeps serving.
    codes: list[int] = []
    out_of_map: list[float] = []
    unready: list[float] = []
    started = time.monotonic()
    while not (time.monotonic() - started > 15 and triton_back(platform, holder)):
        if time.monotonic() - started > 180:
            raise AssertionError(f"{holder}'s worker does not see its Triton back 180 s after tritonserver was killed")
        codes.append(predict(platform, bystander).status_code)
        if not router_sees_ready(platform, holder):
            out_of_map.append(time.monotonic() - started)
        if not pod_ready(kube, holder):
            unready.append(time.monotonic() - started)
        time.sleep(0.5)
    assert all(code == 200 for code in codes), f"requests to {bystander} while {holder}'s Triton was down: {codes}"
    assert not out_of_map, f"{holder} left the router's map while only its Triton was down (at {out_of_map} s)"
    assert not unready, f"{holder} went unready while only its Triton was down (at {unready} s)"
    assert restart_count(kube, holder, TRITON_CONTAINER) == restarts, "Triton was restarted by the kubelet, not in place"
    predict_ok(platform, "iris")  # loaded again (the restarted Triton came back empty)


# -- 7 ------------------------------------------------------------------------------------------
def deleted_model_unloaded(platform: Platform, kube: Kube) -> None:
    """Delete a ServedModel: its copies are unloaded and it leaves GET /models."""
    predict_ok(platform, "iris")
    holders = ready_copies(router_models(platform), "iris")
    kube.delete("servedmodel", "iris")
    wait_for("the iris ServedModel gone (finalizer done)", lambda: not kube.items("servedmodels", "--field-selector", "metadata.name=iris"), 120)
    # The router stops listing it at once (a caller is shown models of ServedModels it may call);
    # each holder unloads it at its next catalog change.
    wait_for("iris out of the router's GET /models",
             lambda: "iris" not in router_models(platform)["available_models"] and not router_models(platform).get("copies", {}).get("iris"), 60)
    for pod in holders:
        wait_for(f"iris unloaded on {pod}",
                 lambda: "iris" not in {c["id"] for c in worker_status(platform, pod)["models"]}, 60)


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
    answer = predict(platform, "ghost", like="sentiment")
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
        with httpx.Client(timeout=60, headers=platform.router_headers) as client:
            while not stop.is_set():
                answer = client.post(f"{platform.router_url}/predict", json={"model_id": name, "input_data": payload("sentiment")})
                answers.append((answer.status_code, answer.headers.get("x-hotset-model-version", "")))

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


# -- models from object storage ---------------------------------------------------------------------
S3_SERVICE = "hotset-s3"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "e2e-s3-user", "AWS_SECRET_ACCESS_KEY": "e2e-s3-secret-key-0123"}


def s3_server_manifests(namespace: str) -> list[dict[str, Any]]:
    """An in-cluster S3 server (MinIO, the tier's hotset-s3 image), its keys as the Secret a
    ServedModel names, and a Job that uploads the sample sentiment model with boto3."""
    labels = {"app": S3_SERVICE}
    keys = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-keys"}, "stringData": S3_KEYS}
    env = [{"name": "MINIO_ROOT_USER", "value": S3_KEYS["AWS_ACCESS_KEY_ID"]},
           {"name": "MINIO_ROOT_PASSWORD", "value": S3_KEYS["AWS_SECRET_ACCESS_KEY"]}]
    server = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": S3_SERVICE},
              "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                  "metadata": {"labels": labels},
                  "spec": {"containers": [{
                      "name": "s3", "image": "hotset-s3:e2e", "imagePullPolicy": "Never",
                      "args": ["server", "/data", "--address", ":9000", "--certs-dir", "/data/.certs"], "env": env,
                      "ports": [{"containerPort": 9000}],
                      "readinessProbe": {"httpGet": {"path": "/minio/health/ready", "port": 9000}, "periodSeconds": 2},
                      "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
                      "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                      "volumes": [{"name": "data", "emptyDir": {}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": S3_SERVICE},
               "spec": {"selector": labels, "ports": [{"port": 9000, "targetPort": 9000}]}}
    upload = (
        "import boto3, pathlib\n"
        f"s3 = boto3.client('s3', endpoint_url='http://{S3_SERVICE}.{namespace}.svc:9000', region_name='us-east-1')\n"
        "s3.create_bucket(Bucket='models')\n"
        "root = pathlib.Path('/mnt/models/sentiment')\n"
        "for path in sorted(p for p in root.rglob('*') if p.is_file()):\n"
        "    s3.upload_file(str(path), 'models', 'sentiment/' + path.relative_to(root).as_posix())\n"
        "print('uploaded', sum(1 for p in root.rglob('*') if p.is_file()), 'files')\n")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "upload-sentiment"},
           "spec": {"backoffLimit": 6, "template": {"spec": {
               "restartPolicy": "OnFailure",
               "containers": [{"name": "upload", "image": "hotset-worker:e2e", "imagePullPolicy": "Never",
                               "command": ["python", "-c", upload],
                               "env": [{"name": k, "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": k}}}
                                       for k in S3_KEYS],
                               "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                               "volumeMounts": [{"name": "models", "mountPath": "/mnt/models", "readOnly": True}]}],
               "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]}}}}
    return [keys, server, service, job]


def model_from_s3_served(platform: Platform, kube: Kube) -> None:
    """A ServedModel whose source is s3:// on the in-cluster S3 server serves through the router; its
    credentials come from the Secret it names (copied by the operator into the pool's credentials
    Secret), the pool's worker downloads it once into its source cache, and the status says so."""
    documents = s3_server_manifests(kube.namespace)
    kube.apply(documents)
    name = "sentiment-s3"
    try:
        wait_for("the upload Job to finish", lambda: (kube.get("job", "upload-sentiment").get("status") or {})
                 .get("succeeded", 0) >= 1, 300, 2.0)
        body = {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": name},
                "spec": {"framework": "transformers", "task": "text-classification", "memory": "4Mi",
                         "replicas": {"min": 0, "max": 1},
                         "source": {"uri": "s3://models/sentiment", "secretName": "s3-keys",
                                    "endpoint": f"http://{S3_SERVICE}.{kube.namespace}.svc:9000"}}}
        kube.apply([body])
        wait_for(f"{name} Accepted", lambda: is_true(kube.served_model(name), "Accepted"), 60, 1.0)
        predict_ok(platform, name, CREDENTIALS_PROPAGATION_S, retry_failed_loads=True)
        holders = [pod["metadata"]["name"] for pod in kube.worker_pods(POOL_SELECTOR)
                   if any(c["id"] == name and c["state"] == "READY"
                          for c in worker_status(platform, pod["metadata"]["name"])["models"])]
        assert holders, f"no pool pod reports {name} READY"
        metrics = httpx.get(f"{platform.worker_url(holders[0])}/metrics", timeout=10).text
        downloads = [line for line in metrics.splitlines()
                     if line.startswith("hotset_source_fetches_total{") and f'model="{name}"' in line
                     and 'result="download"' in line]
        assert downloads and float(downloads[0].rsplit(" ", 1)[1]) == 1.0, downloads
        # Plain http to an endpoint outside the pool's policy is refused at admission.
        refused = {**body, "metadata": {"name": "sentiment-s3-elsewhere"},
                   "spec": {**body["spec"], "source": {**body["spec"]["source"], "endpoint": "http://elsewhere:9000"}}}
        kube.apply([refused])
        wait_for("the refused model's Accepted=False", lambda: condition(
            kube.served_model("sentiment-s3-elsewhere"), "Accepted").get("status") == "False", 60, 1.0)
        message = condition(kube.served_model("sentiment-s3-elsewhere"), "Accepted").get("message", "")
        assert "spec.source.endpoint: http://elsewhere:9000 is not allowed" in message, message
    finally:
        kube.delete("servedmodel", name, "sentiment-s3-elsewhere")
        for document in reversed(documents):
            kube.delete(document["kind"].lower(), document["metadata"]["name"])


# -- models packaged as OCI images --------------------------------------------------------------------
REGISTRY_SERVICE = "hotset-registry"
# A fixed ClusterIP (kind's Service range is 10.96.0.0/16): the nodes' containerd reaches it through
# kube-proxy, and a ServedModel's image reference can name it before the Service exists.
REGISTRY_IP = "10.96.0.250"
REGISTRY = f"{REGISTRY_IP}:5000"


def registry_manifests() -> list[dict[str, Any]]:
    """The CNCF distribution registry (the tier's hotset-registry image) behind a fixed ClusterIP."""
    labels = {"app": REGISTRY_SERVICE}
    server = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": REGISTRY_SERVICE},
              "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                  "metadata": {"labels": labels},
                  "spec": {"containers": [{
                      "name": "registry", "image": "hotset-registry:e2e", "imagePullPolicy": "Never",
                      "ports": [{"containerPort": 5000}],
                      "readinessProbe": {"httpGet": {"path": "/v2/", "port": 5000}, "periodSeconds": 2},
                      "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                      "volumeMounts": [{"name": "data", "mountPath": "/var/lib/registry"}]}],
                      "volumes": [{"name": "data", "emptyDir": {}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": REGISTRY_SERVICE},
               "spec": {"selector": labels, "clusterIP": REGISTRY_IP, "ports": [{"port": 5000, "targetPort": 5000}]}}
    return [server, service]


def push_model_image(pushed_to: str, model_dir: str, repository: str) -> None:
    """`FROM scratch` + the model's folder as the image's root, built and pushed with docker (the
    registry reached at `pushed_to`, host:port on this machine)."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as context:
        shutil.copytree(model_dir, Path(context) / "model")
        (Path(context) / "Dockerfile").write_text("FROM scratch\nCOPY model/ /\n")
        tag = f"{pushed_to}/{repository}"
        for argv in (["docker", "build", "-q", "-t", tag, context], ["docker", "push", tag], ["docker", "rmi", tag]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout[-1000:]}{done.stderr[-2000:]}"


def model_from_oci_image_served(platform: Platform, kube: Kube) -> None:
    """A Triton model packaged as an image, pushed to a real registry (the CNCF distribution
    registry), is mounted by the kubelet as an image volume (Kubernetes 1.36: ImageVolume is GA)
    into a dedicated pod's worker and Triton containers, and serves through the router; Triton
    reads it in place (the staged folder links into the volume)."""
    documents = registry_manifests()
    kube.apply(documents)
    name = "iris-oci"
    try:
        wait_for("the registry Ready", lambda: any(is_true(p, "Ready") for p in
                                                   kube.items("pods", "-l", f"app={REGISTRY_SERVICE}")), 120, 1.0)
        local = platform.service_url(REGISTRY_SERVICE, 5000).removeprefix("http://").replace("127.0.0.1", "localhost")
        from scenarios.chart import REPO

        push_model_image(local, str(REPO / "build" / "models" / "iris"), "models/iris:1")
        platform.trust_registry(REGISTRY)
        body = {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": name},
                "spec": {"framework": "triton", "memory": "8Mi", "placement": "dedicated",
                         "replicas": {"min": 1, "max": 1}, "source": {"uri": f"oci://{REGISTRY}/models/iris:1"}}}
        kube.apply([body])
        wait_for(f"{name} Ready", lambda: is_true(kube.served_model(name), "Ready"), 300, 2.0)
        predict_ok(platform, name)
        pods = kube.worker_pods(f"hotset.io/pool=dedicated,hotset.io/servedmodel={name}")
        assert pods, "no dedicated pod"
        volumes = [v for v in pods[0]["spec"]["volumes"] if "image" in v]
        assert volumes and volumes[0]["image"]["reference"] == f"{REGISTRY}/models/iris:1", volumes
    finally:
        kube.delete("servedmodel", name)
        for document in reversed(documents):
            kube.delete(document["kind"].lower(), document["metadata"]["name"])
