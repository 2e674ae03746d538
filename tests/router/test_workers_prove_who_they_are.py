"""Worker pods prove which pod they are before the router sends them anything, and the router
presents its own ServiceAccount token to them (hotset_common.worker_identity; docs/security.md,
"Workers that prove who they are").

On the session's real control plane: a Deployment labelled as the operator's, three replicas, its
pods running as the workers' ServiceAccount (the ReplicaSet controller makes them; the test plays
the kubelet: it writes their status and mints their projected tokens with the TokenRequest API,
bound to each Pod). All three pass the ownership check:

- pod A runs a real worker whose identity file holds A's own token (at first another pod's: it
  proves itself once the file is rewritten, as the kubelet rotates it);
- pod B's address answers ``/identity`` with A's token (stolen: a pod handing out another's);
- pod C's address answers ``/identity`` with nothing.

B and C are recording servers: the router must send them nothing but the credential-less
``/identity`` question, and serve through A only. The worker verifies the router's token offline,
with the cluster's keys; the router's token file is rotated to another account's token and back,
and the router uses each from its next calls.
"""
from __future__ import annotations

import httpx
import pytest

from hotset_common import worker_identity as identity
from hotset_testing import identities
from hotset_testing.recording_server import RecordingServer
from gateway_helpers import BALLAST_LAUNCHER, local_stack, wait_for, worker_metric, write_ballast_store
from test_cluster_discovery import SELECTOR, free_port_on, set_ready

pytestmark = [pytest.mark.kube, pytest.mark.slow]
NAMESPACE = "default"
IPS = ("127.0.0.81", "127.0.0.82", "127.0.0.83")
UNSCHEDULED = "hotset-test-unscheduled"  # a scheduler nobody runs: no kubelet here, the test plays it
POOL = "proving-pool"


def deployment() -> dict:
    pod_labels = {"app.kubernetes.io/part-of": "hotset", "app.kubernetes.io/component": "worker",
                  "hotset.io/pool": "shared", "hotset-test/deployment": POOL}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": POOL, "labels": {**pod_labels, "app.kubernetes.io/managed-by": "hotset-operator"}},
            "spec": {"replicas": 3, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels},
                                  "spec": {"schedulerName": UNSCHEDULED, "serviceAccountName": identity.WORKER_ACCOUNT,
                                           "automountServiceAccountToken": False,
                                           "containers": [{"name": "worker", "image": "hotset-worker:test"}]}}}}


@pytest.fixture
def pool(kube_cluster, procs, tmp_path):
    """The Deployment's three pods; A's worker (its identity file holding B's token at first), the
    recording servers at B's and C's addresses; and the router's token file."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(kube_cluster.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    identities.ensure_accounts(core, NAMESPACE, identity.WORKER_ACCOUNT, identity.ROUTER_ACCOUNT, "stranger")
    port = free_port_on(*IPS)
    apps.create_namespaced_deployment(NAMESPACE, deployment())
    recorders: list[RecordingServer] = []
    try:
        pods = wait_for(lambda: (found := core.list_namespaced_pod(
            NAMESPACE, label_selector=f"hotset-test/deployment={POOL}").items) and len(found) == 3 and found,
            "the Deployment's three pods", 60)
        a, b, c = sorted(pods, key=lambda p: p.metadata.name)
        own = identities.mint(core, NAMESPACE, identity.WORKER_ACCOUNT, identity.IDENTITY_AUDIENCE, pod=a)
        b_token = identities.mint(core, NAMESPACE, identity.WORKER_ACCOUNT, identity.IDENTITY_AUDIENCE, pod=b)
        identity_file = identities.write_token(tmp_path / "a-identity", b_token)
        keys = identities.write_issuer_keys(api, tmp_path / "keys")
        store = write_ballast_store(tmp_path, {"m": {"mib": 4}})
        worker = local_stack.start_worker(
            "proving-worker", store, procs.log_dir, "50Mi", port=port, host=IPS[0], launcher=BALLAST_LAUNCHER,
            extra_args=["--min-residency-s", "0", "--caller-keys", str(keys), "--trusted-callers",
                        f"{NAMESPACE}:{identity.ROUTER_ACCOUNT}", "--identity-token-file", str(identity_file)])
        procs.started.append(worker)
        recorders += [RecordingServer(IPS[1], port, {identity.IDENTITY_PATH: identity.identity_answer(b.metadata.name, own)}),
                      RecordingServer(IPS[2], port)]
        local_stack.wait_http(worker, "/v2/health/ready", 90)
        for pod, ip in zip((a, b, c), IPS):
            set_ready(core, pod.metadata.name, ip, True)
        router_token = identities.write_token(
            tmp_path / "router-token", identities.mint(core, NAMESPACE, identity.ROUTER_ACCOUNT, identity.CALLER_AUDIENCE))
        yield {"port": port, "recorders": recorders, "identity_file": identity_file, "own": own,
               "router_token": router_token, "core": core}
    finally:
        for recorder in recorders:
            recorder.close()
        apps.delete_namespaced_deployment(POOL, NAMESPACE, propagation_policy="Foreground")
        api.close()


def pods_listed(router) -> list[str]:
    return [p["url"] for p in httpx.get(f"{router.url}/router/pods", timeout=10).json()]


def predict(router, value: float) -> httpx.Response:
    return httpx.post(f"{router.url}/predict", json={"model_id": "m", "input_data": [value]}, timeout=60)


def test_only_a_pod_that_proves_which_pod_it_is_gets_requests_and_the_routers_token(kube_cluster, pool, procs):
    port = pool["port"]
    router = procs.router([], args=["--cluster", "--kubeconfig", str(kube_cluster.kubeconfig), "--namespace",
                                    NAMESPACE, "--worker-selector", SELECTOR, "--worker-port", str(port),
                                    "--worker-identity", "pod-token", "--worker-token-file", str(pool["router_token"])],
                          urls=["unused"], wait_ready=False)
    # A holds B's token, B hands out A's, C nothing: all three owned, none proven.
    wait_for(lambda: worker_metric(router.url, "hotset_router_unowned_worker_pods") == 3, "three unproven pods", 60)
    assert pods_listed(router) == []

    identities.write_token(pool["identity_file"], pool["own"])  # the kubelet rotates A's token: now its own
    wait_for(lambda: pods_listed(router) == [f"http://{IPS[0]}:{port}"], "A proved itself (its file re-read)", 60)
    assert worker_metric(router.url, "hotset_router_unowned_worker_pods") == 2
    for value in range(5):  # cold, then warm: every request lands on A, which verified the router's token
        answer = predict(router, value)
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"]["scaled"] == [2.0 * value]

    # The router's token rotated to another account's: A refuses it (403) and leaves the map ...
    core = pool["core"]
    identities.write_token(pool["router_token"], identities.mint(core, NAMESPACE, "stranger", identity.CALLER_AUDIENCE))
    wait_for(lambda: pods_listed(router) == [], "A refusing the stranger's token", 60)
    # ... and back to a fresh token of its own: A serves again, from the router's next calls.
    identities.write_token(pool["router_token"],
                           identities.mint(core, NAMESPACE, identity.ROUTER_ACCOUNT, identity.CALLER_AUDIENCE))
    wait_for(lambda: pods_listed(router) == [f"http://{IPS[0]}:{port}"], "A serving the router's new token", 60)
    assert predict(router, 7).status_code == 200

    # B and C were asked who they are, with no credential, and nothing else.
    for recorder in pool["recorders"]:
        assert recorder.requests, "asked for its identity"
        assert {(method, path, auth) for method, path, auth in recorder.requests} == {("GET", identity.IDENTITY_PATH, "")}
