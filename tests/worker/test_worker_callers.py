"""A cluster worker answers only the router's and the operator's own ServiceAccount tokens
(hotset_worker/callers.py; docs/security.md, "Workers that prove who they are").

On the session's real API server: real ServiceAccounts, tokens from the TokenRequest API (as the
kubelet projects them), the cluster's issuer and keys read from its discovery endpoints by the
operator's own code and written as the keys ConfigMap's files, a real worker app on uvicorn, over
HTTP and gRPC. The worker makes no API call: it verifies offline.
"""
from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from hotset_common import worker_identity as identity
from hotset_testing import ballast_framework as ballast, identities
from hotset_testing.ballast_framework import MiB
from hotset_testing.grpc_clients import fp32_input, grpc_client, refusal
from hotset_testing.worker_server import ballast_app, serve_in_thread
from hotset_worker.callers import IssuerKeys, ServiceAccountCallers

pytestmark = [pytest.mark.kube]
NAMESPACE = "worker-callers"
ROUTER = identity.account_user(NAMESPACE, identity.ROUTER_ACCOUNT)
OPERATOR = identity.account_user(NAMESPACE, identity.OPERATOR_ACCOUNT)


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    from kubernetes import client, config

    api = config.new_client_from_config(str(kube_cluster.kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    identities.ensure_accounts(core, NAMESPACE, identity.ROUTER_ACCOUNT, identity.OPERATOR_ACCOUNT, "stranger")
    try:
        yield api, core
    finally:
        core.delete_namespace(NAMESPACE)
        api.close()


def token(core, account: str, audience: str = identity.CALLER_AUDIENCE) -> str:
    return identities.mint(core, NAMESPACE, account, audience)


@pytest.fixture(scope="module")
def worker(cluster, tmp_path_factory):
    """A worker that answers the router and the operator (as the operator configures cluster pods)."""
    api, core = cluster
    root = tmp_path_factory.mktemp("callers")
    keys = root / "keys"
    identities.write_issuer_keys(api, keys)
    (root / "identity").write_text("the-pods-identity-token")
    store = ballast.catalog(root / "models", {"a": {}})
    callers = ServiceAccountCallers(IssuerKeys(keys), frozenset({ROUTER, OPERATOR}))
    app = ballast_app(store, budget=8 * MiB, callers=callers, identity=identity.BearerToken(path=root / "identity"),
                      grpc_address="127.0.0.1:0")
    with serve_in_thread(app) as url:
        yield url, core


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def predict(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/predict", json={"model_id": "a", "input_data": [1.0]}, headers=headers, timeout=30)


def forged(genuine: str) -> str:
    """`genuine` with its claims changed and its signature kept (the key id is the cluster's)."""
    head, payload, signature = genuine.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = ROUTER
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{head}.{forged_payload}.{signature}"


def test_only_the_router_and_the_operator_are_answered_and_each_refusal_names_what_is_missing(worker) -> None:
    url, core = worker
    for account in (identity.ROUTER_ACCOUNT, identity.OPERATOR_ACCOUNT):
        answer = predict(url, bearer(token(core, account)))
        assert answer.status_code == 200, answer.text
    router = bearer(token(core, identity.ROUTER_ACCOUNT))
    assert httpx.get(f"{url}/status", headers=router).status_code == 200

    missing = predict(url, {})
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert "'Authorization: Bearer <token>'" in missing.json()["error"] and "'hotset-worker'" in missing.json()["error"]
    stranger = predict(url, bearer(token(core, "stranger")))
    assert stranger.status_code == 403, stranger.text
    assert stranger.json()["error"] == (f"system:serviceaccount:{NAMESPACE}:stranger may not call this worker: it "
                                        f"answers only {OPERATOR}, {ROUTER}")
    for sent, words in [(token(core, identity.ROUTER_ACCOUNT, "hotset"), "not made for the audience 'hotset-worker'"),
                        ("not-a-jwt", "not a ServiceAccount token (not a JWT)"),
                        (forged(token(core, "stranger")), "does not verify"),
                        (token(core, identity.ROUTER_ACCOUNT, identity.IDENTITY_AUDIENCE), "not made for the audience")]:
        answer = predict(url, bearer(sent))
        assert answer.status_code == 401 and words in answer.json()["error"], (words, answer.text)
    for path in ("/status", "/models", "/v2/repository/models/a/unload"):  # every route, not only inference
        method = "POST" if path.endswith("unload") else "GET"
        assert httpx.request(method, url + path, headers=bearer(token(core, "stranger"))).status_code == 403, path


def test_probes_metrics_and_the_pods_identity_answer_anyone(worker) -> None:
    url, _ = worker
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(url + path).status_code == 200, path
    answer = httpx.get(url + identity.IDENTITY_PATH)
    assert answer.status_code == 200 and answer.json() == {"pod": "test-pod", "token": "the-pods-identity-token"}


def test_over_grpc_the_same_accounts_are_answered(worker) -> None:
    url, core = worker
    port = httpx.get(f"{url}/status", headers=bearer(token(core, identity.ROUTER_ACCOUNT))).json()["grpc_port"]
    values = np.ones(2, dtype=np.float32)
    tensor = fp32_input(values)
    with grpc_client(f"127.0.0.1:{port}") as client:
        assert client.is_server_live()  # the probes need nothing
        assert refusal(lambda: client.infer("a", [tensor])).status() == "StatusCode.UNAUTHENTICATED"
        stranger = refusal(lambda: client.infer("a", [tensor], headers={"authorization": f"Bearer {token(core, 'stranger')}"}))
        assert stranger.status() == "StatusCode.PERMISSION_DENIED" and "stranger may not call" in stranger.message()
        answer = client.infer("a", [tensor], headers={"authorization": f"Bearer {token(core, identity.ROUTER_ACCOUNT)}"})
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), values * 2)


def test_until_the_keys_are_there_a_worker_answers_503_then_it_reads_them(cluster, tmp_path) -> None:
    """A pod may start before the operator wrote its keys ConfigMap (an optional volume)."""
    api, core = cluster
    keys = tmp_path / "keys"
    store = ballast.catalog(tmp_path / "models", {"a": {}})
    callers = ServiceAccountCallers(IssuerKeys(keys, reread_s=0.1), frozenset({ROUTER}))
    with serve_in_thread(ballast_app(store, budget=8 * MiB, callers=callers)) as url:
        router = bearer(token(core, identity.ROUTER_ACCOUNT))
        waiting = predict(url, router)
        assert waiting.status_code == 503 and waiting.headers["Retry-After"] == "5", waiting.text
        assert "cannot check its callers yet" in waiting.json()["error"] and identity.KEYS_CONFIGMAP in waiting.json()["error"]
        assert httpx.get(url + identity.IDENTITY_PATH).status_code == 404  # no identity token: none handed out
        identities.write_issuer_keys(api, keys)
        from hotset_testing.polling import wait_for

        wait_for(lambda: predict(url, router).status_code == 200, "the keys read once written", 10, 0.1)
