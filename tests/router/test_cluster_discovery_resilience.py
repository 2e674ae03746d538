"""Cluster discovery keeps going when its connection to the API server goes half-open, and its
table is never read while a watch thread changes it (a real kube-apiserver behind a real TCP proxy)."""
from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import pytest

from gateway_helpers import wait_for
from test_cluster_discovery import SELECTOR, STAND_INS, cluster, kube, make_pod, set_ready  # noqa: F401 - fixtures

pytestmark = [pytest.mark.kube, pytest.mark.slow]


class FreezableProxy:
    """Relays TCP to the API server; `freeze()` stops relaying on the connections open now, without
    closing them: a half-open connection, as a dead NAT entry or a vanished peer leaves."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen: set[int] = set()
        self.generation = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.generation += 1

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            born = self.generation
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, born), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, born: int) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.generation != born:
                    threading.Event().wait()  # hold it open, relay nothing, forever
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def test_a_half_open_watch_is_restarted_and_new_pods_are_seen(kube_cluster, kube):  # noqa: F811
    from kubernetes import client, config
    from hotset_router.discovery import KubeDiscovery

    server = urlparse(kube_cluster.server)
    proxy = FreezableProxy((server.hostname, server.port))
    proxied = config.new_client_from_config(str(kube_cluster.kubeconfig))
    proxied.configuration.host = f"https://127.0.0.1:{proxy.port}"
    proxied.configuration.verify_ssl = False
    core = client.CoreV1Api(kube)
    make_pod(core, "half-open-a", None)
    make_pod(core, "half-open-b", None)
    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=proxied, watch_timeout_s=3, request_timeout_s=2, trust=STAND_INS)
    discovery.start()
    try:
        set_ready(core, "half-open-a", "127.0.0.21", True)
        wait_for(lambda: "http://127.0.0.21:8080" in discovery.urls(), "pod a in discovery")
        proxy.freeze()
        set_ready(core, "half-open-b", "127.0.0.22", True)
        wait_for(lambda: "http://127.0.0.22:8080" in discovery.urls(), "pod b after the frozen watch", 30)
        assert "http://127.0.0.21:8080" in discovery.urls()
    finally:
        discovery.stop()
        proxy.close()
        for name in ("half-open-a", "half-open-b"):
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_readers_never_see_the_table_change_under_them(kube):  # noqa: F811
    from kubernetes import client
    from hotset_router.discovery import KubeDiscovery

    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=kube, trust=STAND_INS)
    pods = [client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"p{i}", labels={"hotset.io/pool": "shared"}),
        spec=client.V1PodSpec(node_name="n", containers=[]),
        status=client.V1PodStatus(pod_ip=f"10.0.{i // 250}.{i % 250}", conditions=[client.V1PodCondition(type="Ready", status="True")]),
    ) for i in range(500)]
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for pod in pods:
                discovery.apply_pod_event("ADDED", pod)
            for pod in pods:
                discovery.apply_pod_event("DELETED", pod)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(3000):
            discovery.urls()
            discovery.pool_of("http://10.0.0.1:8080")
    finally:
        stop.set()
        writer.join()


def test_a_restarted_watch_never_empties_the_table(kube):  # noqa: F811
    """Watches end (server timeout, a dropped connection) and start again with a fresh listing;
    meanwhile the router must keep every pod it knows (an empty table empties the map)."""
    from kubernetes import client
    from hotset_router.discovery import KubeDiscovery

    core = client.CoreV1Api(kube)
    names = [f"restart-{i}" for i in range(30)]
    for i, name in enumerate(names):
        make_pod(core, name, None)
        set_ready(core, name, f"127.0.1.{i + 1}", True)
    discovery = KubeDiscovery("default", SELECTOR, 8080, api_client=kube, watch_timeout_s=1, request_timeout_s=5, trust=STAND_INS)
    discovery.start()
    try:
        wait_for(lambda: len([u for u in discovery.urls() if u.startswith("http://127.0.1.")]) == 30, "all pods")
        seen = set()
        deadline = __import__("time").monotonic() + 6  # several restarts (the server ends each watch after 1 s)
        while __import__("time").monotonic() < deadline:
            seen.add(len([u for u in discovery.urls() if u.startswith("http://127.0.1.")]))
        assert seen == {30}
    finally:
        discovery.stop()
        for name in names:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
