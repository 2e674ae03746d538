"""The whole control plane on the test control plane, for autoscaling tests and benchmarks.

Real components only: the ``kube_cluster`` API server, controller-manager and
scheduler; the ``hotset-operator`` and ``hotset-router`` commands as
processes; worker pods run by ``PodPlayer`` as real ``hotset-worker``
processes (ballast models: exact sizes, load and predict times). What is not
real is the kubelet (``pod_player.py`` says what it stands in for).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx

from hotset_common import worker_identity as identity
from hotset_testing import polling, processes
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.pod_player import PodPlayer

BIN = Path(sys.executable).parent
MiB = 2**20


def write_ballast(root: Path, name: str, mib: float, load_delay_s: float = 0.0, predict_delay_s: float = 0.0) -> None:
    """A ballast model folder at `root`/`name`, read through `pvc://models/<name>`."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ballast.json").write_text(json.dumps({"bytes": int(mib * MiB), "load_delay_s": load_delay_s,
                                                     "factor": 2.0, "predict_delay_s": predict_delay_s}))


def served_model(name: str, mib: float, min_copies: int = 0, max_copies: int = 1, idle_s: int = 300,
                 placement: str = "shared") -> dict[str, Any]:
    return {"apiVersion": "hotset.io/v1alpha1", "kind": "ServedModel", "metadata": {"name": name},
            "spec": {"framework": "torchvision", "task": "tensor", "source": {"uri": f"pvc://models/{name}"},
                     "memory": f"{int(mib)}Mi", "placement": placement,
                     "replicas": {"min": min_copies, "max": max_copies, "idleSeconds": idle_s}}}


class ScalingStack:
    """Operator + router + pod player in one namespace of a running KubeCluster."""

    def __init__(self, kube: KubeCluster, namespace: str, workdir: Path, operator_settings: dict[str, Any],
                 start_delay_s: float = 0.0, router_args: tuple[str, ...] = (), identity: bool = False) -> None:
        """`identity`: worker identity on, as the chart installs it (hotset_common.worker_identity):
        the ServiceAccounts the chart makes, the router's and the operator's own tokens for workers in
        files (as their pods' projected volumes hold them), pods proving which pod they are."""
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.models = workdir / "models"
        self.models.mkdir(parents=True, exist_ok=True)
        self.operator_settings = operator_settings
        self.start_delay_s = start_delay_s
        self.router_args = router_args
        self.identity = identity
        self.tokens = workdir / "tokens"  # identity: the router's and the operator's tokens for workers
        self.worker_port = processes.free_port()
        self.router: processes.Process | None = None
        self.operator: processes.Process | None = None
        self.player: PodPlayer | None = None
        self._stack = contextlib.ExitStack()

    # --- start and stop --------------------------------------------------------------------

    def __enter__(self) -> "ScalingStack":
        try:
            if self.identity:
                self._make_identities()
            self.player = self._stack.enter_context(PodPlayer(self.kube, self.workdir / "pods", self.worker_port,
                                                              self.models, start_delay_s=self.start_delay_s,
                                                              namespace=self.namespace))
            self.operator = self._stack.enter_context(self._start_operator())
            self.router = self._stack.enter_context(self._start_router())
            processes.wait_http(self.router, "/v2/health/live", 60)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()

    def _make_identities(self) -> None:
        """The chart's ServiceAccounts, and the router's and the operator's tokens for workers."""
        for account in (identity.WORKER_ACCOUNT, identity.ROUTER_ACCOUNT, identity.OPERATOR_ACCOUNT):
            self.kubectl("create", "serviceaccount", account, check=False)
        self.tokens.mkdir(parents=True, exist_ok=True)
        for account in (identity.ROUTER_ACCOUNT, identity.OPERATOR_ACCOUNT):
            self.write_token(account, self.mint(account, identity.CALLER_AUDIENCE))

    def mint(self, account: str, audience: str) -> str:
        """A token of `account` for `audience` (TokenRequest), as a projected volume holds one."""
        return self.kubectl("create", "token", account, "--audience", audience, "--duration", "1h").stdout.strip()

    def token_file(self, account: str) -> Path:
        return self.tokens / account

    def write_token(self, account: str, token: str) -> None:
        """Replace `account`'s token file whole, as the kubelet rotates a projected token."""
        partial = self.tokens / f".{account}.tmp"
        partial.write_text(token)
        partial.replace(self.token_file(account))

    def _start_operator(self) -> processes.Process:
        env = {**os.environ, "KUBECONFIG": str(self.kube.kubeconfig), "HOTSET_OPERATOR_NAMESPACE": self.namespace,
               "HOTSET_OPERATOR_WORKER_PORT": str(self.worker_port)}
        catalog_port = processes.free_port()
        defaults = {"gpu_mode": "none", "pod_memory_budget": "100Mi", "worker_memory": "1Gi",
                    "pool_sync_interval_s": 0.5, "catalog_host": "127.0.0.1", "catalog_port": catalog_port,
                    "catalog_url": f"http://127.0.0.1:{catalog_port}"}
        if self.identity:
            defaults.update(worker_identity="pod-token", worker_service_account=identity.WORKER_ACCOUNT,
                            worker_token_file=str(self.token_file(identity.OPERATOR_ACCOUNT)))
        for key, value in {**defaults, **self.operator_settings}.items():
            env[f"HOTSET_OPERATOR_{key.upper()}"] = str(value)
        liveness = f"http://127.0.0.1:{processes.free_port()}/healthz"
        return processes.spawn("operator", [str(BIN / "hotset-operator"), f"--liveness={liveness}"],
                               self.workdir / "operator.log", env=env, url=liveness.removesuffix("/healthz"))

    def _start_router(self) -> processes.Process:
        port = processes.free_port()
        argv = [str(BIN / "hotset-router"), "--cluster", "--kubeconfig", str(self.kube.kubeconfig),
                "--namespace", self.namespace, "--worker-port", str(self.worker_port), "--host", "127.0.0.1",
                "--port", str(port), "--sync-interval", "0.5", *self.router_args]
        if self.identity:
            argv += ["--worker-identity", "pod-token", "--worker-token-file",
                     str(self.token_file(identity.ROUTER_ACCOUNT))]
        return processes.spawn("router", argv, self.workdir / "router.log", url=f"http://127.0.0.1:{port}")

    # --- what tests do and read --------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        return self.kube.kubectl("-n", self.namespace, *args, input=input, check=check)

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def pool(self) -> dict[str, Any]:
        return self.get("workerpool", "hotset-pool") or {}

    def replicas(self, deployment: str) -> int | None:
        return ((self.get("deployment", deployment) or {}).get("spec") or {}).get("replicas")

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        body = self.get("servedmodel", name) or {}
        return next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == kind), None)

    def predict(self, client: httpx.Client, model: str, timeout_s: float = 120) -> httpx.Response:
        assert self.router is not None
        return client.post(f"{self.router.url}/predict", json={"model_id": model, "input_data": [1]},
                           headers={"x-hotset-timeout": str(timeout_s)}, timeout=timeout_s + 5)

    def wait_for(self, predicate, what: str, timeout: float = 60.0):
        return polling.wait_for(predicate, what, timeout, 0.2)


@contextlib.contextmanager
def scaling_stack(kube: KubeCluster, namespace: str, workdir: Path, **kwargs: Any) -> Iterator[ScalingStack]:
    with ScalingStack(kube, namespace, workdir, **kwargs) as stack:
        yield stack
