"""Callers checked by the cluster (``hotset-router --cluster --auth kubernetes``), and each namespace's
request rate from its ModelQuota, on a real kube-apiserver.

Two tenants' namespaces, one ServedModel each, served by one real worker
process on a loopback "pod IP" (the test plays the kubelet, as in
test_cluster_discovery.py). Callers are real ServiceAccounts with tokens from
the TokenRequest API; the router asks the real API server TokenReview and
SubjectAccessReview, with RBAC deciding.
"""
from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from gateway_helpers import BALLAST_LAUNCHER, local_stack, loads, wait_for, worker_metric, write_ballast_store
from hotset_common import labels
from hotset_testing.grpc_clients import fp32_input, grpc_client, refusal
from hotset_testing.processes import free_port
from test_cluster_discovery import STAND_IN_ARGS, free_port_on, make_pod, set_ready

pytestmark = [pytest.mark.kube, pytest.mark.slow]
SELECTOR = "app.kubernetes.io/component=worker"
TENANTS = {"alpha": "tenant-a", "beta": "tenant-b"}  # model -> its namespace
GROUP, VERSION = "hotset.io", "v1alpha1"
CALLER_ROLE = "hotset-test-model-caller"


@pytest.fixture(scope="module")
def api(kube_cluster):
    from kubernetes import config

    for crd in ("servedmodel", "modelquota"):
        kube_cluster.kubectl("apply", "-f", str(local_stack.ROOT / f"crds/{crd}.yaml"))
    wait_for(lambda: kube_cluster.kubectl("get", "servedmodels", check=False).returncode == 0, "the CRD", 30)
    api_client = config.new_client_from_config(str(kube_cluster.kubeconfig))
    yield api_client
    api_client.close()


def bind(rbac, namespace: str, service_account: str, subject_namespace: str, name: str) -> None:
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CALLER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": subject_namespace}]})


@pytest.fixture(scope="module")
def tenants(api):
    """The namespaces, their ServedModels, the caller ClusterRole (as the chart ships it) and a
    ServiceAccount in tenant-a bound to it there."""
    from kubernetes import client

    core, custom, rbac = client.CoreV1Api(api), client.CustomObjectsApi(api), client.RbacAuthorizationV1Api(api)
    for namespace in TENANTS.values():
        core.create_namespace({"metadata": {"name": namespace}})
    rbac.create_cluster_role({"metadata": {"name": CALLER_ROLE}, "rules": [
        {"apiGroups": [GROUP], "resources": ["servedmodels/predict"], "verbs": ["create"]}]})
    for model, namespace in TENANTS.items():
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "servedmodels", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ServedModel", "metadata": {"name": model},
            "spec": {"framework": "torchvision", "task": "tensor", "source": {"uri": f"pvc://models/{model}"},
                     "memory": "2Mi"}})
    core.create_namespaced_service_account("tenant-a", {"metadata": {"name": "app"}})
    bind(rbac, "tenant-a", "app", "tenant-a", "app-calls-tenant-a")
    try:
        yield core, rbac
    finally:
        rbac.delete_cluster_role(CALLER_ROLE)
        for namespace in TENANTS.values():
            core.delete_namespace(namespace)


def token(core, namespace: str, service_account: str, audiences: list[str]) -> str:
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=audiences,
                                                                                 expiration_seconds=3600))
    return core.create_namespaced_service_account_token(service_account, namespace, request).status.token


@contextlib.contextmanager
def router_checking_callers(core, procs, kube_cluster, tmp_path, name: str, ip: str, extra_args: list[str] = ()):
    """One worker that can serve both models (pod `name` in default, on `ip`), and the router checking callers."""
    store = write_ballast_store(tmp_path, {"alpha": {"mib": 2}, "beta": {"mib": 2}})
    port = free_port_on(ip)
    worker = local_stack.start_worker(name, store, procs.log_dir, "50Mi", port=port, host=ip,
                                      extra_args=["--min-residency-s", "0", "--grpc-port", "0"], launcher=BALLAST_LAUNCHER)
    procs.started.append(worker)
    local_stack.wait_http(worker, "/v2/health/ready", 90)
    make_pod(core, f"pod-{name}", None)
    set_ready(core, f"pod-{name}", ip, True)
    grpc_port = free_port()
    try:
        router = procs.router([], args=[
            "--grpc-port", str(grpc_port),
            "--cluster", "--kubeconfig", str(kube_cluster.kubeconfig), "--namespace", "default",
            "--watch-namespaces", "default,tenant-a,tenant-b", "--worker-selector", SELECTOR, *STAND_IN_ARGS,
            "--worker-port", str(port), "--auth", "kubernetes", "--auth-audiences", "hotset", *extra_args],
            urls=["unused"])
        wait_for(lambda: httpx.get(f"{router.url}/v2/health/ready", timeout=5).status_code == 200, "a ready pod", 60)
        yield router, worker, f"127.0.0.1:{grpc_port}"
    finally:
        core.delete_namespaced_pod(f"pod-{name}", "default", grace_period_seconds=0)


@pytest.fixture
def authenticated_router(api, tenants, procs, kube_cluster, tmp_path):
    with router_checking_callers(tenants[0], procs, kube_cluster, tmp_path, "worker-auth", "127.0.0.51") as started:
        yield started


def predict(url: str, model: str, token: str | None = None, prefix: str = "") -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}{prefix}/predict", json={"model_id": model, "input_data": [2]}, headers=headers,
                      timeout=60)


def reviews(router_url: str) -> float:
    return worker_metric(router_url, "hotset_router_caller_reviews_total")


def test_only_callers_the_cluster_allows_reach_a_model_and_nothing_loads_for_the_others(authenticated_router, tenants):
    router, worker, grpc_address = authenticated_router
    core, rbac = tenants
    app_token = token(core, "tenant-a", "app", ["hotset"])

    # no token, or a token made for the API server (a pod's default): 401 naming what to send
    for sent in (None, token(core, "tenant-a", "app", ["https://kubernetes.default.svc.cluster.local"]), "garbage"):
        answer = predict(router.url, "alpha", sent)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == "Bearer"
        assert ("Authorization: Bearer" in answer.json()["detail"]) == (sent is None), answer.text
    assert httpx.get(f"{router.url}/models", timeout=10).status_code == 401
    assert httpx.get(f"{router.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{router.url}/router/pods", timeout=10).status_code == 401
    assert httpx.get(f"{router.url}/v2/models/alpha/ready", timeout=10).status_code == 401

    # tenant-a's app calls tenant-a's model, bare or by namespace
    answer = predict(router.url, "alpha", app_token)
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"]["scaled"] == [4.0]
    assert predict(router.url, "alpha", app_token, prefix="/namespaces/tenant-a").status_code == 200

    # ...and not tenant-b's: 403 naming the permission; the model is neither loaded nor listed
    answer = predict(router.url, "beta", app_token)
    assert answer.status_code == 403, answer.text
    assert "create" in answer.json()["detail"] and "servedmodels/predict" in answer.json()["detail"]
    headers = {"Authorization": f"Bearer {app_token}"}
    assert httpx.get(f"{router.url}/v2/models/beta", headers=headers, timeout=10).status_code == 403
    assert httpx.get(f"{router.url}/v2/models/beta/ready", headers=headers, timeout=10).status_code == 403
    listed = httpx.get(f"{router.url}/models", headers=headers, timeout=10).json()
    assert set(listed["available_models"]) == {"alpha"} and set(listed["copies"]) == {"alpha"}
    (pod,) = httpx.get(f"{router.url}/router/pods", headers=headers, timeout=10).json()
    assert set(pod["copies"]) == {"alpha"}
    # tenant-a's model is not found in tenant-b's namespace
    answer = predict(router.url, "alpha", app_token, prefix="/namespaces/tenant-b")
    assert answer.status_code == 404, answer.text
    assert loads(worker.url, "beta") == 0 and loads(worker.url, "alpha") == 1

    # gRPC takes the same checks, the token in the call's metadata
    with grpc_client(grpc_address) as client:
        tensor = [fp32_input(np.array([1.0, 2.0], dtype=np.float32))]
        assert "UNAUTHENTICATED" in str(refusal(lambda: client.infer("alpha", tensor)).status())
        metadata = {"authorization": f"Bearer {app_token}"}
        assert "PERMISSION_DENIED" in str(refusal(lambda: client.infer("beta", tensor, headers=metadata)).status())
        assert "PERMISSION_DENIED" in str(refusal(lambda: client.is_model_ready("beta", headers=metadata)).status())
        assert client.infer("alpha", tensor, headers=metadata).as_numpy("OUTPUT0").tolist() == [2.0, 4.0]
    assert loads(worker.url, "beta") == 0

    # the hot path asks the API server nothing while its answers are cached
    asked = reviews(router.url)
    for _ in range(20):
        assert predict(router.url, "alpha", app_token).status_code == 200
    assert reviews(router.url) == asked

    # a grant made now works within the refusal's short cache
    bind(rbac, "tenant-b", "app", "tenant-a", "app-calls-tenant-b")
    wait_for(lambda: predict(router.url, "beta", app_token).status_code == 200, "the new grant to take", 20)
    assert loads(worker.url, "beta") == 1


def test_a_namespace_over_its_modelquota_rate_gets_429_and_other_namespaces_are_served(authenticated_router, tenants,
                                                                                         api):
    from kubernetes import client

    router, worker, _ = authenticated_router
    core, rbac = tenants
    try:
        bind(rbac, "tenant-b", "app", "tenant-a", "app-calls-tenant-b")
    except client.ApiException as exc:
        assert exc.status == 409  # made by the test before
    app_token = token(core, "tenant-a", "app", ["hotset"])
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "tenant-a", "modelquotas", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelQuota", "metadata": {"name": "rate"},
        "spec": {"requestsPerSecond": 0.2, "burst": 3, "servingWeight": 4}})
    try:
        def refused() -> httpx.Response | None:
            answer = predict(router.url, "alpha", app_token)
            return answer if answer.status_code == 429 else None

        answer = wait_for(refused, "tenant-a's burst to be spent", 30)  # the quota reaches the router, then 3 pass
        assert "ModelQuota allows 0.2 requests a second (burst 3)" in answer.json()["detail"], answer.text
        assert 1 <= int(answer.headers["retry-after"]) <= 5
        # The quota's servingWeight reached the worker with tenant-a's requests (its threads' shares).
        assert worker_metric(worker.url, "hotset_share_weight", namespace="tenant-a") == 4
        # tenant-b has no limit: served while tenant-a is refused; a client's own weight is not passed on
        forged = {"Authorization": f"Bearer {app_token}", "x-hotset-share-weight": "tenant-b=999"}
        assert all(httpx.post(f"{router.url}/predict", json={"model_id": "beta", "input_data": [2]}, headers=forged,
                              timeout=60).status_code == 200 for _ in range(10))
        assert worker_metric(worker.url, "hotset_share_weight", namespace="tenant-b") == 1
        assert predict(router.url, "alpha", app_token).status_code == 429
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, "tenant-a", "modelquotas", "rate")
    wait_for(lambda: predict(router.url, "alpha", app_token).status_code == 200, "no limit once the quota goes", 30)


def wake_mark(custom, namespace: str, model: str) -> str | None:
    """The router's wake annotation on a ServedModel (labels.WANTED_AT): what scales a min-0 group up."""
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "servedmodels", model)
    return (body["metadata"].get("annotations") or {}).get(labels.WANTED_AT)


def test_a_caller_without_the_grant_cannot_wake_another_namespaces_min_zero_dedicated_group(
        authenticated_router, tenants, api):
    """tenant-b's min-0 dedicated model has no pod: a request for it would be held while the router
    asks the operator for one (the wanted-at annotation the operator scales the group up on). A
    caller without the grant is refused before that: 403, no annotation, and so no scale-up; a
    caller with it does leave the annotation (the check would see a wake)."""
    from kubernetes import client

    router, worker, grpc_address = authenticated_router
    core, rbac = tenants
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "tenant-b", "servedmodels", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ServedModel", "metadata": {"name": "gamma"},
        "spec": {"framework": "torchvision", "task": "tensor", "source": {"uri": "pvc://models/gamma"},
                 "memory": "2Mi", "placement": "dedicated", "replicas": {"min": 0, "max": 2}}})
    core.create_namespaced_service_account("tenant-a", {"metadata": {"name": "stranger"}})
    try:
        stranger = token(core, "tenant-a", "stranger", ["hotset"])
        wait_for(lambda: httpx.get(f"{router.url}/v2/models/gamma/ready", timeout=10,
                                   headers={"Authorization": f"Bearer {stranger}"}).status_code == 403 or None,
                 "gamma to reach the router", 20)
        for sent in (None, stranger):
            answer = predict(router.url, "gamma", sent)
            assert answer.status_code == (401 if sent is None else 403), answer.text
        answer = predict(router.url, "gamma", stranger, prefix="/namespaces/tenant-b")
        assert answer.status_code == 403 and "servedmodels/predict" in answer.json()["detail"], answer.text
        with grpc_client(grpc_address) as grpc_caller:
            tensor = [fp32_input(np.array([1.0], dtype=np.float32))]
            metadata = {"authorization": f"Bearer {stranger}"}
            assert "PERMISSION_DENIED" in str(refusal(lambda: grpc_caller.infer("gamma", tensor, headers=metadata)).status())
        assert wake_mark(custom, "tenant-b", "gamma") is None  # nothing asked the operator for a pod
        assert worker_metric(router.url, "hotset_router_pod_waits_total", model="gamma") == 0

        # a caller tenant-b grants is held for a pod, and the router asks for one: the annotation appears
        bind(rbac, "tenant-b", "stranger", "tenant-a", "stranger-calls-tenant-b")

        def held() -> httpx.Response | None:
            answer = httpx.post(f"{router.url}/predict", json={"model_id": "gamma", "input_data": [2]}, timeout=30,
                                headers={"Authorization": f"Bearer {stranger}", "X-Hotset-Timeout": "2"})
            return answer if answer.status_code == 503 else None
        answer = wait_for(held, "the grant to take", 30)
        assert "no pod of 'gamma' is ready yet" in answer.json()["detail"], answer.text
        wait_for(lambda: wake_mark(custom, "tenant-b", "gamma"), "the router's wake annotation", 10)
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, "tenant-b", "servedmodels", "gamma")
        core.delete_namespaced_service_account("stranger", "tenant-a")
        with contextlib.suppress(client.ApiException):
            rbac.delete_namespaced_role_binding("stranger-calls-tenant-b", "tenant-b")


CORP_AUDIENCE = "corp-gateway"


@pytest.fixture
def published_issuer(api, kube_cluster, tmp_path):
    """The API server as an OIDC issuer the router is told to trust (as an identity provider a
    cluster's API server does not trust would be): its discovery document and keys published to
    anonymous readers, as one publishes a cluster's issuer, and an AuthenticationConfiguration in
    Kubernetes' own format naming it, for tokens of another audience than the TokenReview's."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role_binding({
        "metadata": {"name": "test-public-issuer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:service-account-issuer-discovery"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]})
    kubeconfig = json.loads(kube_cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    cluster = kubeconfig["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode() if "certificate-authority-data" in cluster \
        else Path(cluster["certificate-authority"]).read_text()
    issuer = "https://kubernetes.default.svc.cluster.local"
    config = tmp_path / "authentication.yaml"
    config.write_text(json.dumps({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AuthenticationConfiguration",
        "jwt": [{"issuer": {"url": issuer, "discoveryURL": f"{kube_cluster.server}/.well-known/openid-configuration",
                            "audiences": [CORP_AUDIENCE], "certificateAuthority": ca},
                 "claimMappings": {"username": {"claim": "sub", "prefix": "corp:"}}}]}))
    try:
        yield config, issuer
    finally:
        rbac.delete_cluster_role_binding("test-public-issuer")


def test_callers_of_an_oidc_issuer_the_router_trusts_are_verified_by_the_router_and_allowed_by_rbac(
        api, tenants, procs, kube_cluster, tmp_path, published_issuer):
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    core, rbac = tenants
    config, issuer = published_issuer
    with router_checking_callers(core, procs, kube_cluster, tmp_path, "worker-oidc", "127.0.0.52",
                                 ["--auth-config", str(config)]) as (router, worker, _):
        corp_token = token(core, "tenant-a", "app", [CORP_AUDIENCE])
        caller = "corp:system:serviceaccount:tenant-a:app"  # the issuer's subject, with the entry's prefix

        # verified by the router (no TokenReview), named as the entry maps it, and refused by RBAC
        # until that name is granted the model
        token_reviews = worker_metric(router.url, "hotset_router_caller_reviews_total", question="who")
        answer = predict(router.url, "alpha", corp_token)
        assert answer.status_code == 403, answer.text
        assert caller in answer.json()["detail"], answer.text
        assert worker_metric(router.url, "hotset_router_caller_reviews_total", question="jwt", answer="yes") == 1
        assert loads(worker.url, "alpha") == 0
        rbac.create_namespaced_role_binding("tenant-a", {
            "metadata": {"name": "corp-app-calls-tenant-a"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CALLER_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": caller}]})
        wait_for(lambda: predict(router.url, "alpha", corp_token).status_code == 200, "the grant to the issuer's caller", 20)
        assert predict(router.url, "beta", corp_token).status_code == 403  # tenant-b's model is not granted
        assert worker_metric(router.url, "hotset_router_caller_reviews_total", question="who") == token_reviews

        # the hot path verifies nothing again while the identity is kept
        asked = reviews(router.url)
        for _ in range(20):
            assert predict(router.url, "alpha", corp_token).status_code == 200
        assert reviews(router.url) == asked

        # a token that claims the issuer but another key signed it: 401 saying why, nothing loads
        claims = jwt.decode(corp_token, options={"verify_signature": False})
        forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode({**claims, "sub": "system:serviceaccount:tenant-b:admin"}, forger, algorithm="RS256",
                            headers={"kid": jwt.get_unverified_header(corp_token)["kid"]})
        answer = predict(router.url, "beta", forged)
        assert answer.status_code == 401, answer.text
        assert issuer in answer.json()["detail"] and "does not verify" in answer.json()["detail"], answer.text
        # ...and one of another audience than the entry's or the router's: 401 naming the audience
        answer = predict(router.url, "alpha", token(core, "tenant-a", "app", ["elsewhere"]))
        assert answer.status_code == 401 and CORP_AUDIENCE in answer.json()["detail"], answer.text
        assert loads(worker.url, "beta") == 0

        # tokens the entry does not take still go to the TokenReview: the router's own audience passes
        assert predict(router.url, "alpha", token(core, "tenant-a", "app", ["hotset"])).status_code == 200
        assert worker_metric(router.url, "hotset_router_caller_reviews_total", question="who") > token_reviews
        rbac.delete_namespaced_role_binding("corp-app-calls-tenant-a", "tenant-a")
