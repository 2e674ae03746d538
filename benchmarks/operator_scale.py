#!/usr/bin/env python3
"""The operator with thousands of ServedModels, on the real control plane, beside the one it replaces.

For each size N, on a fresh control plane (``tests/hotset_testing/kube_cluster.py``: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler) and the ``hotset-operator`` command
under a ServiceAccount of its own:

1. **accept**: N shared ServedModels created at once (16 requests in flight); seconds from the
   last create until every one is ``Accepted=True``, seen through a watch (and checked with a
   LIST when the watch says so);
2. **steady**: with nothing changing, the operator's CPU (utime + stime from /proc, as a share of
   one core) and its API requests per second (kube-apiserver's audit log, filtered to its
   ServiceAccount) over ``--steady-s``; its resident memory;
3. **edit**: one model's description changed, five times; seconds until a worker's catalog has
   it, measured by two followers: the worker's own ``FollowedModelStore`` (the code a pool pod
   runs) and a bare long-poll client of the feed. Today's operator has no feed: the time until
   its model-store ConfigMap holds the edit (a lower bound: its pods then still wait for their
   kubelet to remount it);
4. **restart**: the operator stopped and started again; seconds until it has converged (the
   feed serves all N models and nothing is left to write; today's: every ServedModel's resume
   handler done), the API writes it made meanwhile, and its admission decisions.

Today's operator is the commit ``--baseline`` names (docs/benchmarks.md measured d516879, the
operator before this landing, of the history before the rename that this repository does not
carry; benchmarks/baseline_tree.py), run from a ``git archive`` of its ``common`` and
``operator`` folders at the sizes it can manage. Without one only this tree is measured.
Nodes are not registered, so pool pods stay Pending: no worker reports, as in a cluster whose
pools are idle.

5. **reporting pods** (``--reporting-pods``, a control plane of its own per tree): ``--reporting-models``
   ServedModels and that many STAND-IN worker pods (tests/hotset_testing/standin_pods.py: one
   process serving every pod's ``GET /status`` with the worker's own report builder, each pod on a
   loopback address of its own and the operator's worker port; every pod's catalog lists every
   model, each model has a copy on one pod). Pod objects labelled as the shared pool's workers,
   their status Running and Ready at those addresses (no kubelet here; the operator runs with
   ``--worker-trust labelled``, since no Deployment of its own owns them). Once every model's
   status lists its copy, the operator's CPU, the /status bytes the stand-ins served it (and its
   own count, ``hotset_operator_report_bytes_total``, where the tree has it) and its API requests
   over ``--reporting-s``, with nothing changing; this tree beside ``--reporting-baseline``
   (default 46c5323, the commit before the operator followed reports by cursor).

The machine is whatever runs this (docs/benchmarks.md says which).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hotset_common import labels  # noqa: E402
from hotset_common.model_store import CatalogUpdate  # noqa: E402
from hotset_testing import kube_cluster, processes  # noqa: E402
from hotset_testing.kube_cluster import KubeCluster  # noqa: E402
from hotset_worker.store import FollowedModelStore  # noqa: E402
from baseline_tree import present, unpack  # noqa: E402

NAMESPACE = "bench"
ACCOUNT = "hotset-operator"
GROUP, VERSION, PLURAL = "hotset.io", "v1alpha1", "servedmodels"
CONCURRENCY = 16
LOCAL = httpx.Client()  # one client for the polls of the operator's metrics and feed (no TLS set-up each)
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["system:serviceaccount:bench:hotset-operator"]
  - level: None
"""


@dataclass
class Result:
    implementation: str
    models: int
    accept_s: float | None = None  # from the last create until all Accepted; None: not within the limit
    accepted: int = 0
    create_s: float = 0.0
    cpu_share: float = 0.0
    api_per_s: float = 0.0
    api_verbs: dict[str, int] = field(default_factory=dict)
    rss_mib: float = 0.0
    edit_s: list[float] = field(default_factory=list)
    edit_raw_s: list[float] = field(default_factory=list)
    restart_s: float | None = None
    restart_writes: int = 0
    restart_decisions: float | None = None
    load: list[float] = field(default_factory=list)  # the machine's 1-minute load average: accept, steady, restart
    notes: list[str] = field(default_factory=list)


# --- the control plane and the operator --------------------------------------------------------

class Api:
    """Plain HTTPS against the API server as its admin (cheaper per request than the kubernetes client)."""

    def __init__(self, cluster: KubeCluster) -> None:
        pki = cluster.workdir / "pki"
        self.base = cluster.server
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.tls = dict(verify=context)
        self.sync = httpx.Client(timeout=60, **self.tls)

    def path(self, name: str = "") -> str:
        tail = f"/{name}" if name else ""
        return f"{self.base}/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}{tail}"

    async def create_all(self, bodies: list[dict[str, Any]]) -> float:
        """POST every body, CONCURRENCY at once; the monotonic time of the last create."""
        queue = list(reversed(bodies))
        last = 0.0
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(timeout=60, limits=limits, **self.tls) as http:
            async def worker() -> None:
                nonlocal last
                while queue:
                    body = queue.pop()
                    answer = await http.post(self.path(), json=body)
                    if answer.status_code != 201:
                        raise RuntimeError(f"create {body['metadata']['name']}: {answer.status_code} {answer.text[:200]}")
                    last = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return last

    def accepted_count(self) -> int:
        items = self.sync.get(self.path()).json()["items"]
        return sum(_accepted(item) for item in items)

    def patch_description(self, name: str, text: str) -> None:
        answer = self.sync.patch(self.path(name), content=json.dumps({"spec": {"description": text}}),
                                 headers={"Content-Type": "application/merge-patch+json"})
        answer.raise_for_status()

    def configmap(self, name: str) -> dict[str, Any]:
        answer = self.sync.get(f"{self.base}/api/v1/namespaces/{NAMESPACE}/configmaps/{name}")
        return answer.json() if answer.status_code == 200 else {}


def _accepted(item: dict[str, Any]) -> bool:
    return any(c.get("type") == "Accepted" and c.get("status") == "True"
               for c in (item.get("status") or {}).get("conditions") or [])


class AcceptedWatch:
    """Counts Accepted=True ServedModels from a watch stream, in a thread."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.accepted: set[str] = set()
        self.all_at: float | None = None
        self.want = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, want: int) -> None:
        self.want = want
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(30, read=None), **self.api.tls) as http:
            listing = http.get(self.api.path()).json()
            version = listing["metadata"]["resourceVersion"]
            for item in listing["items"]:
                self._see(item)
            while not self._stop.is_set():
                try:
                    with http.stream("GET", self.api.path(), params={"watch": "1", "resourceVersion": version,
                                                                       "timeoutSeconds": "60"}) as stream:
                        for line in stream.iter_lines():
                            event = json.loads(line)
                            if event["type"] == "ERROR":
                                break
                            version = event["object"]["metadata"]["resourceVersion"]
                            self._see(event["object"])
                            if self._stop.is_set():
                                return
                except httpx.HTTPError:
                    time.sleep(0.2)

    def _see(self, item: dict[str, Any]) -> None:
        name = item["metadata"]["name"]
        if _accepted(item):
            self.accepted.add(name)
            if self.all_at is None and self.want and len(self.accepted) >= self.want:
                self.all_at = time.monotonic()


def served_model(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServedModel", "metadata": {"name": name},
            "spec": {"framework": "torchvision", "task": "tensor", "source": {"uri": f"pvc://models/{name}"},
                     "memory": "16Mi", "replicas": {"min": 0, "max": 1}}}


def prepare_cluster(cluster: KubeCluster, workdir: Path) -> Path:
    """The namespace, the operator's ServiceAccount (cluster-admin: the benchmark measures work, not
    RBAC) and a kubeconfig with its token."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", ACCOUNT)
    cluster.kubectl("create", "clusterrolebinding", "bench-operator", "--clusterrole=cluster-admin",
                    f"--serviceaccount={NAMESPACE}:{ACCOUNT}")
    token = cluster.kubectl("-n", NAMESPACE, "create", "token", ACCOUNT, "--duration=6h").stdout.strip()
    path = workdir / "operator.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.workdir / "pki" / "ca.crt")}}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": ACCOUNT, "namespace": NAMESPACE}}],
    }))
    return path


@dataclass
class Operator:
    implementation: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    metrics_url: str = ""
    catalog_url: str = ""
    process: processes.Process | None = None

    def start(self) -> None:
        self.process = processes.spawn("operator", self.argv, self.log, env=self.env, append=True,
                                       stop_timeout_s=20)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(20)
            self.process = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def metric(self, name: str, **labels: str) -> float | None:
        if not self.metrics_url:
            return None
        try:
            text = LOCAL.get(self.metrics_url, timeout=5).text
        except httpx.HTTPError:
            return None
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return None


def baseline_tree(commit: str, workdir: Path) -> Path | None:
    """`common` and `operator` of `commit`, unpacked (None: none named, or not in this clone)."""
    return unpack(commit, workdir, "common", "operator") if commit and present(commit) else None


def operator_for(implementation: str, kubeconfig: Path, workdir: Path, baseline: Path | None) -> Operator:
    metrics_port, catalog_port = processes.free_port(), processes.free_port()
    env = {"KUBECONFIG": str(kubeconfig), "HOTSET_OPERATOR_NAMESPACE": NAMESPACE, "HOTSET_OPERATOR_GPU_MODE": "none",
           "HOTSET_OPERATOR_POD_MEMORY_BUDGET": "8Gi", "HOTSET_OPERATOR_WORKER_MEMORY": "16Gi",
           "HOTSET_OPERATOR_POOL_MAX_PODS": "8", "HOTSET_OPERATOR_METRICS_PORT": str(metrics_port),
           "HOTSET_LOG_LEVEL": "INFO"}
    liveness = f"--liveness=http://127.0.0.1:{processes.free_port()}/healthz"
    if implementation == "today":
        assert baseline is not None
        env["PYTHONPATH"] = f"{baseline / 'common'}:{baseline / 'operator'}"
        argv = [sys.executable, "-c", "import sys; from hotset_operator.main import main; main(sys.argv[1:])", liveness]
        return Operator(implementation, argv, env, workdir / f"operator-{implementation}.log",
                        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    env.update({"HOTSET_OPERATOR_CATALOG_HOST": "127.0.0.1", "HOTSET_OPERATOR_CATALOG_PORT": str(catalog_port),
                "HOTSET_OPERATOR_CATALOG_URL": f"http://127.0.0.1:{catalog_port}"})
    argv = [str(Path(sys.executable).parent / "hotset-operator"), liveness]
    return Operator(implementation, argv, env, workdir / f"operator-{implementation}.log",
                    metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
                    catalog_url=f"http://127.0.0.1:{catalog_port}/v1/catalogs/{NAMESPACE}/pool")


# --- measuring ---------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def audit_requests(log: Path, since: float, until: float) -> dict[str, int]:
    """The operator's requests by verb, between two wall-clock times (requests, not stages)."""
    seen: dict[str, str] = {}
    if not log.exists():
        return {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        at = datetime.datetime.fromisoformat(record["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if since <= at < until:
            seen[record["auditID"]] = record["verb"]
    verbs: dict[str, int] = {}
    for verb in seen.values():
        verbs[verb] = verbs.get(verb, 0) + 1
    return verbs


def wait(predicate, limit_s: float, interval_s: float = 0.2) -> float | None:
    """Seconds until `predicate()` holds (None: not within `limit_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval_s)
    return None


def feed_models(url: str) -> int:
    try:
        answer = LOCAL.get(url, timeout=30)
    except httpx.HTTPError:
        return -1
    return len(CatalogUpdate.model_validate_json(answer.content).models) if answer.status_code == 200 else -1


def raw_long_poll(url: str, cursor: str, model: str, text: str, limit_s: float) -> tuple[float | None, str]:
    """A bare client of the feed (not the worker's store): when (monotonic) `model` said `text`."""
    started = time.monotonic()
    with httpx.Client(timeout=40) as http:
        while time.monotonic() - started < limit_s:
            update = CatalogUpdate.model_validate_json(http.get(url, params={"since": cursor, "wait": "25"}).content)
            cursor = update.cursor
            if any(m["id"] == model and m.get("description") == text for m in update.models):
                return time.monotonic(), cursor
    return None, cursor


def measure_edits(api: Api, operator: Operator, models: int, rounds: int = 5) -> tuple[list[float], list[float]]:
    target = f"m-{models // 2:05d}"
    seconds, raw = [], []
    if operator.catalog_url:
        store = FollowedModelStore(operator.catalog_url, first_wait_s=60)
        try:
            cursor = CatalogUpdate.model_validate_json(LOCAL.get(operator.catalog_url, timeout=60).content).cursor
            for n in range(rounds):
                text = f"edit {n} at {time.time():.3f}"
                result: dict[str, Any] = {}
                poller = threading.Thread(target=lambda: result.update(
                    zip(("at", "cursor"), raw_long_poll(operator.catalog_url, cursor, target, text, 30))))
                poller.start()
                time.sleep(0.3)  # the bare client is parked in its long poll
                started = time.monotonic()
                api.patch_description(target, text)
                took = wait(lambda: _description(store, target) == text, 30, 0.005)
                poller.join()
                cursor = result.get("cursor", cursor)
                if took is not None:
                    seconds.append(took)
                if result.get("at") is not None:
                    raw.append(result["at"] - started)
                time.sleep(1.0)
        finally:
            store.close()
        return seconds, raw
    for n in range(rounds):  # today's: the ConfigMap every pool pod mounts
        text = f"edit {n} at {time.time():.3f}"
        api.patch_description(target, text)
        took = wait(lambda: text in json.dumps(api.configmap("hotset-models").get("data") or {}), 60, 0.05)
        if took is not None:
            seconds.append(took)
        time.sleep(1.0)
    return seconds, raw


def _description(store: FollowedModelStore, model: str) -> str:
    try:
        return store.get(model).description
    except Exception:  # noqa: BLE001 - not there yet
        return ""


def restarted(operator: Operator, models: int, limit_s: float) -> float | None:
    """Stop and start the operator; seconds from the start until it converged."""
    operator.stop()
    log_before = operator.log.read_text() if operator.log.exists() else ""
    operator.start()
    started = time.monotonic()
    if operator.catalog_url:
        def converged() -> bool:
            return (feed_models(operator.catalog_url) == models and operator.metric("hotset_operator_writes_pending") == 0
                    and (operator.metric("hotset_operator_pool_passes_total") or 0) >= 1)
    else:
        def converged() -> bool:
            log = operator.log.read_text()[len(log_before):]
            return log.count("Resuming is processed") >= models
    took = wait(converged, limit_s, 0.5)
    return None if took is None else took


def audit_flags(workdir: Path, name: str) -> tuple[Path, list[str]]:
    """The API server's flags that log every request (AUDIT_POLICY) to an audit log of its own; the log."""
    audit = workdir / f"audit-{name}.log"
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return audit, [f"--audit-policy-file={policy}", f"--audit-log-path={audit}", "--audit-log-maxsize=2000",
                   "--audit-log-format=json"]


def run_one(implementation: str, models: int, args: argparse.Namespace, workdir: Path,
            baseline: Path | None) -> Result:
    result = Result(implementation, models)
    audit, flags = audit_flags(workdir, f"{implementation}-{models}")
    crds = sorted((ROOT / "crds").glob("*.yaml"))
    with kube_cluster.running(workdir / f"kube-{implementation}-{models}", manifests=crds, apiserver_flags=flags) as cluster:
        kubeconfig = prepare_cluster(cluster, workdir)
        api = Api(cluster)
        operator = operator_for(implementation, kubeconfig, workdir, baseline)
        operator.start()
        try:
            time.sleep(3.0)
            watch = AcceptedWatch(api)
            watch.start(models)
            began = time.monotonic()
            last = asyncio.run(api.create_all([served_model(f"m-{i:05d}") for i in range(models)]))
            result.create_s = last - began
            limit = args.accept_limit_s
            wait(lambda: watch.all_at is not None, limit, 0.5)
            watch.stop()
            result.load.append(os.getloadavg()[0])
            result.accepted = len(watch.accepted)
            if watch.all_at is not None:
                result.accept_s = max(0.0, watch.all_at - last)
                listed = api.accepted_count()
                if listed != models:
                    result.notes.append(f"the watch saw all accepted, a LIST {listed}")
            else:
                result.notes.append(f"{result.accepted} of {models} accepted after {limit:.0f} s")
            # Nothing changes now: let the last writes land, then measure a quiet window.
            if operator.catalog_url:
                wait(lambda: operator.metric("hotset_operator_writes_pending") == 0, 120, 0.5)
            time.sleep(args.settle_s)
            cpu_before, wall_before, stamp = cpu_seconds(operator.pid), time.monotonic(), time.time()
            time.sleep(args.steady_s)
            cpu_after, wall_after, stamp_after = cpu_seconds(operator.pid), time.monotonic(), time.time()
            result.cpu_share = (cpu_after - cpu_before) / (wall_after - wall_before)
            result.load.append(os.getloadavg()[0])
            result.rss_mib = rss_mib(operator.pid)
            time.sleep(2.0)  # the audit log is written in batches
            result.api_verbs = audit_requests(audit, stamp, stamp_after)
            result.api_per_s = sum(result.api_verbs.values()) / (stamp_after - stamp)
            result.edit_s, result.edit_raw_s = measure_edits(api, operator, models)
            stamp = time.time()
            result.restart_s = restarted(operator, models, args.restart_limit_s)
            result.load.append(os.getloadavg()[0])
            time.sleep(2.0)
            writes = audit_requests(audit, stamp, time.time())
            result.restart_writes = sum(n for verb, n in writes.items() if verb in ("create", "update", "patch", "delete"))
            if operator.catalog_url:
                result.restart_decisions = operator.metric("hotset_operator_admission_decisions_total")
            if result.restart_s is None:
                result.notes.append(f"restart: not converged within {args.restart_limit_s:.0f} s")
        finally:
            operator.stop()
    return result


# --- phase 5: pods reporting ---------------------------------------------------------------------

STANDINS = ROOT / "tests" / "hotset_testing" / "standin_pods.py"
FIRST_POD_IP = "127.0.70.1"


@dataclass
class Reporting:
    implementation: str
    pods: int
    models: int
    seen_s: float | None = None  # from the pods being Running until every model's status lists its copy
    cpu_share: float = 0.0
    served_bytes_s: float = 0.0  # /status bytes the stand-ins answered, per second (the operator is their only reader)
    answers_s: float = 0.0
    read_bytes_s: float | None = None  # the operator's own count, where the tree has it
    api_per_s: float = 0.0
    rss_mib: float = 0.0
    load: float = 0.0
    notes: list[str] = field(default_factory=list)


def standin_pod(name: str) -> dict[str, Any]:
    """A Pod object labelled as a shared pool's worker: the stand-in process plays its container.
    A scheduler name nobody serves keeps the real scheduler (and with it the pod GC) off it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {labels.PART_OF: labels.PROJECT, labels.COMPONENT: labels.WORKER,
                                    labels.POOL: labels.SHARED_POOL}},
            "spec": {"schedulerName": "standin", "containers": [{"name": "worker", "image": "standin"}]}}


def seen_copies(api: Api) -> int:
    """ServedModels whose status lists a copy."""
    items = api.sync.get(api.path()).json()["items"]
    return sum(1 for item in items if (item.get("status") or {}).get("copies"))


def run_reporting(implementation: str, tree: Path | None, args: argparse.Namespace, workdir: Path) -> Reporting:
    result = Reporting(implementation, args.reporting_pods, args.reporting_models)
    audit, flags = audit_flags(workdir, f"reporting-{implementation}")
    crds = sorted((ROOT / "crds").glob("*.yaml"))
    port = processes.free_port()
    tag = implementation.replace(" ", "-")
    with kube_cluster.running(workdir / f"kube-reporting-{tag}", manifests=crds, apiserver_flags=flags) as cluster:
        kubeconfig = prepare_cluster(cluster, workdir)
        api = Api(cluster)
        ready = workdir / f"standins-{tag}.json"
        per_pod = -(-args.reporting_models // args.reporting_pods)
        standins = processes.spawn("standins", [
            sys.executable, str(STANDINS), "--pods", str(args.reporting_pods), "--models", str(args.reporting_models),
            "--copies-per-pod", str(per_pod), "--first-ip", FIRST_POD_IP, "--port", str(port),
            "--name-format", "m-{:05d}", "--ready-file", str(ready)], workdir / f"standins-{tag}.log")
        operator = operator_for("this landing", kubeconfig, workdir, None)
        operator.implementation = implementation
        operator.log = workdir / f"operator-reporting-{tag}.log"
        operator.env.update({"HOTSET_OPERATOR_WORKER_TRUST": "labelled", "HOTSET_OPERATOR_WORKER_PORT": str(port),
                             "HOTSET_OPERATOR_POOL_MIN_PODS": str(args.reporting_pods),
                             "HOTSET_OPERATOR_POOL_MAX_PODS": str(2 * args.reporting_pods)})
        if tree is not None:  # the older tree's operator, from its own folders
            operator.env["PYTHONPATH"] = f"{tree / 'common'}:{tree / 'operator'}"
            operator.argv = [sys.executable, "-c", "import sys; from hotset_operator.main import main; main(sys.argv[1:])",
                             *operator.argv[1:]]
        try:
            if wait(lambda: ready.exists() or not standins.alive(), 120) is None or not standins.alive():
                raise RuntimeError(f"the stand-in pods did not start:\n{standins.log_tail()}")
            layout = json.loads(ready.read_text())
            operator.start()
            asyncio.run(api.create_all([served_model(f"m-{i:05d}") for i in range(args.reporting_models)]))
            base = f"{api.base}/api/v1/namespaces/{NAMESPACE}/pods"
            for index, (name, url) in enumerate(zip(layout["pods"], layout["urls"])):
                ip = url.split("//", 1)[1].rsplit(":", 1)[0]
                api.sync.post(base, json=standin_pod(name)).raise_for_status()
                api.sync.patch(f"{base}/{name}/status", headers={"Content-Type": "application/merge-patch+json"},
                               content=json.dumps({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                                             "conditions": [{"type": "Ready", "status": "True"}]}}))
            result.seen_s = wait(lambda: seen_copies(api) >= args.reporting_models, args.accept_limit_s, 1.0)
            if result.seen_s is None:
                result.notes.append(f"{seen_copies(api)} of {args.reporting_models} models list their copy")
            if operator.catalog_url:
                wait(lambda: operator.metric("hotset_operator_writes_pending") == 0, 120, 0.5)
            time.sleep(args.settle_s)
            stats = lambda: httpx.get(f"{layout['urls'][0]}/_standin/stats", timeout=10).json()  # noqa: E731
            before, read_before = stats(), operator.metric("hotset_operator_report_bytes_total")
            cpu_before, wall_before, stamp = cpu_seconds(operator.pid), time.monotonic(), time.time()
            time.sleep(args.reporting_s)
            cpu_after, wall_after, stamp_after = cpu_seconds(operator.pid), time.monotonic(), time.time()
            after, read_after = stats(), operator.metric("hotset_operator_report_bytes_total")
            wall = wall_after - wall_before
            result.cpu_share = (cpu_after - cpu_before) / wall
            result.served_bytes_s = (after["status_bytes"] - before["status_bytes"]) / wall
            result.answers_s = (after["status_answers"] - before["status_answers"]) / wall
            if read_before is not None and read_after is not None:
                result.read_bytes_s = (read_after - read_before) / wall
            result.rss_mib = rss_mib(operator.pid)
            result.load = os.getloadavg()[0]
            time.sleep(2.0)  # the audit log is written in batches
            verbs = audit_requests(audit, stamp, stamp_after)
            result.api_per_s = sum(verbs.values()) / (stamp_after - stamp)
            result.notes.append(f"API requests by verb {verbs}")
        finally:
            operator.stop()
            standins.stop()
    return result


def report_reporting(results: list[Reporting]) -> None:
    print("\n| operator | stand-in pods x models | every copy in the models' status after | steady CPU (one core) "
          "| /status bytes read per s (stand-ins' count) | the operator's own count | answers per s "
          "| API requests/s | RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        own = "-" if r.read_bytes_s is None else f"{r.read_bytes_s / 1e3:,.1f} KB"
        seen = "-" if r.seen_s is None else f"{r.seen_s:.1f} s"
        print(f"| {r.implementation} | {r.pods} x {r.models:,} | {seen} | {r.cpu_share * 100:.1f}% | "
              f"{r.served_bytes_s / 1e3:,.1f} KB | {own} | {r.answers_s:.1f} | {r.api_per_s:.2f} | {r.rss_mib:.0f} MiB |")
    for r in results:
        print(f"- {r.implementation}: load average {r.load:.1f}; " + "; ".join(r.notes))
    if len(results) == 2 and results[0].served_bytes_s and results[1].cpu_share:
        old, new = results[1], results[0]
        print(f"- {old.implementation} / {new.implementation}: bytes read "
              f"{old.served_bytes_s / max(new.served_bytes_s, 1e-6):.0f}x, steady CPU "
              f"{old.cpu_share / max(new.cpu_share, 1e-6):.1f}x")


# --- reporting ---------------------------------------------------------------------------------

def _s(value: float | None, limit: str = "") -> str:
    return f"> {limit} s" if value is None else f"{value:.1f} s"


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s (max {max(values):.2f})"


def report(results: list[Result], args: argparse.Namespace) -> None:
    print("\n| implementation | models | all Accepted after the last create | steady CPU (one core) | API requests/s idle "
          "| RSS | edit -> workers' catalog (median, max) | bare feed client | restart converged | API writes during restart |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        accept = _s(r.accept_s, f"{args.accept_limit_s:.0f}") + ("" if r.accept_s is not None else f" ({r.accepted} of {r.models})")
        print(f"| {r.implementation} | {r.models:,} | {accept} | {r.cpu_share * 100:.1f}% | {r.api_per_s:.2f} | "
              f"{r.rss_mib:.0f} MiB | {_spread(r.edit_s)} | {_spread(r.edit_raw_s)} | "
              f"{_s(r.restart_s, f'{args.restart_limit_s:.0f}')} | {r.restart_writes} |")
    for r in results:
        extra = [f"creates took {r.create_s:.1f} s", f"idle requests by verb {r.api_verbs}",
                 "load average at accept / steady / restart " + " / ".join(f"{x:.1f}" for x in r.load)]
        if r.restart_decisions is not None:
            extra.append(f"admission decisions since the restart: {r.restart_decisions:.0f}")
        print(f"- {r.implementation} x {r.models:,}: " + "; ".join(extra + r.notes))
    pairs = {(r.implementation, r.models): r for r in results}
    for n in sorted({r.models for r in results}):
        old, new = pairs.get(("today", n)), pairs.get(("this landing", n))
        if old and new and old.cpu_share and new.cpu_share:
            print(f"- at {n:,} models: steady CPU {old.cpu_share / max(new.cpu_share, 1e-6):.0f}x lower, "
                  f"API requests {old.api_per_s / max(new.api_per_s, 1e-6):.0f}x fewer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--baseline-sizes", default="300,1000", help="sizes for today's operator ('' : none)")
    parser.add_argument("--baseline", default="", help="the commit of today's operator ('': none)")
    parser.add_argument("--steady-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--accept-limit-s", type=float, default=300.0)
    parser.add_argument("--restart-limit-s", type=float, default=300.0)
    parser.add_argument("--reporting-pods", type=int, default=10, help="phase 5's stand-in pods (0: skip it)")
    parser.add_argument("--reporting-models", type=int, default=1000)
    parser.add_argument("--reporting-s", type=float, default=30.0)
    parser.add_argument("--reporting-baseline", default="46c5323",
                        help="the tree phase 5 measures beside this one ('': none)")
    parser.add_argument("--only-reporting", action="store_true", help="run phase 5 alone")
    args = parser.parse_args()
    # A SIGTERM (a timeout, a Ctrl-C'd wrapper) unwinds like an error, so every control plane and
    # operator this run started is stopped by its `finally` (a killed run left them running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        kube_cluster.find_binaries()
    except kube_cluster.BinariesMissing as exc:
        sys.exit(str(exc))
    workdir = Path(tempfile.mkdtemp(prefix="hotset-operator-scale-"))
    results: list[Result] = []
    reporting: list[Reporting] = []
    try:
        baseline = baseline_tree(args.baseline, workdir) if args.baseline_sizes else None
        runs = [("today", int(n)) for n in args.baseline_sizes.split(",") if n and baseline is not None]
        runs += [("this landing", int(n)) for n in args.sizes.split(",") if n]
        if args.only_reporting:
            runs = []
        if args.baseline_sizes and args.baseline and baseline is None:
            print(f"commit {args.baseline} is not in this clone: today's operator is not measured")
        for implementation, models in sorted(runs, key=lambda run: (run[1], run[0] != "today")):
            print(f"--- {implementation}, {models:,} ServedModels", flush=True)
            results.append(run_one(implementation, models, args, workdir, baseline))
            print(results[-1], flush=True)
        if args.reporting_pods:
            older = baseline_tree(args.reporting_baseline, workdir) if args.reporting_baseline else None
            trees = [("this landing", None)] + ([(args.reporting_baseline, older)] if older is not None else [])
            for implementation, tree in trees:
                print(f"--- {implementation}: {args.reporting_pods} reporting stand-in pods x "
                      f"{args.reporting_models:,} models", flush=True)
                reporting.append(run_reporting(implementation, tree, args, workdir))
                print(reporting[-1], flush=True)
    finally:
        if results:
            report(results, args)
        if reporting:
            report_reporting(reporting)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
