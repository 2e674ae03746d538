"""A test-infrastructure "kubelet" for e2e/local (not product code).

    .venv/bin/python e2e/local/node_agent.py --kubeconfig KUBECONFIG \\
        --node gpu-node-1 --node gpu-node-2 --gpus 1 --state-dir /tmp/agent [--pvc-root DIR]

For each ``--node`` it registers a Node with ``nvidia.com/gpu`` (and cpu,
memory, pods) capacity, keeps it Ready (status heartbeat and a Lease in
kube-node-lease every 10 s), watches the pods the scheduler binds to it and
runs their containers as local processes (see nodeagent/commands.py for how
images map to local programs and which text is rewritten, nodeagent/pods.py
for status and deletion). Each pod gets its own loopback address as pod IP.

State for tests: ``<state dir>/pods/<namespace>/<pod>/<container>.pid|.log``.
SIGTERM/SIGINT stops every process the agent started, then the agent exits.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nodeagent import kubeapi  # noqa: E402
from nodeagent.nodes import NodeConfig, NodeKeeper, PodAddresses  # noqa: E402
from nodeagent.pods import AgentContext, PodRunner  # noqa: E402

log = logging.getLogger("nodeagent")

HEARTBEAT_S = 10.0
WATCH_TIMEOUT_S = 60
FINAL_PHASES = ("Succeeded", "Failed")


class NodeAgent:
    def __init__(self, ctx: AgentContext, nodes: list[NodeConfig]) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self._stopping = threading.Event()
        self._runners: dict[str, PodRunner] = {}
        self._lock = threading.Lock()
        self._addresses = {n.name: PodAddresses(n) for n in nodes}
        self._keepers = [NodeKeeper(ctx.api, n) for n in nodes]

    def run(self) -> None:
        for keeper in self._keepers:
            keeper.register()
            log.info("node %s registered (host IP %s, %s GPU)", keeper.node.name, keeper.node.host_ip, keeper.node.gpus)
        threads = [threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)]
        threads += [threading.Thread(target=self._watch, args=(n,), name=f"watch-{n.name}", daemon=True) for n in self.nodes]
        for thread in threads:
            thread.start()
        self._stopping.wait()
        self._shutdown()

    def stop(self) -> None:
        self._stopping.set()

    def _heartbeats(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            for keeper in self._keepers:
                try:
                    keeper.heartbeat()
                except Exception as err:  # noqa: BLE001 - a missed beat is retried next period
                    log.warning("heartbeat of %s failed: %s", keeper.node.name, err)

    def _watch(self, node: NodeConfig) -> None:
        core = client.CoreV1Api(self.ctx.api)
        selector = f"spec.nodeName={node.name}"
        while not self._stopping.is_set():
            try:
                listed = core.list_pod_for_all_namespaces(field_selector=selector)
                seen = {p.metadata.uid for p in listed.items}
                for pod in listed.items:
                    self._on_pod("ADDED", kubeapi.to_dict(self.ctx.api, pod), node)
                self._forget_missing(node, seen)
                stream = watch.Watch().stream(core.list_pod_for_all_namespaces, field_selector=selector,
                                              resource_version=listed.metadata.resource_version,
                                              timeout_seconds=WATCH_TIMEOUT_S)
                for event in stream:
                    if self._stopping.is_set():
                        return
                    self._on_pod(event["type"], kubeapi.to_dict(self.ctx.api, event["object"]), node)
            except ApiException as err:
                log.info("pod watch of %s restarts: %s", node.name, err.reason)
            except Exception:  # noqa: BLE001 - keep watching whatever happened
                log.exception("pod watch of %s failed; restarting", node.name)
                self._stopping.wait(1.0)

    def _on_pod(self, kind: str, pod: dict[str, Any], node: NodeConfig) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            runner = self._runners.get(uid)
            if kind == "DELETED":
                if runner:
                    runner.request_stop(0, delete=False)
                    del self._runners[uid]
                return
            if meta.get("deletionTimestamp"):
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                if runner:
                    runner.request_stop(grace, delete=True)
                else:
                    self._finish_delete(pod)
                return
            if runner:
                runner.update(pod)
                return
            if (pod.get("status") or {}).get("phase") in FINAL_PHASES:
                return
            runner = PodRunner(self.ctx, node, self._addresses[node.name], pod)
            self._runners[uid] = runner
        log.info("pod %s/%s bound to %s: starting", meta["namespace"], meta["name"], node.name)
        runner.start()

    def _forget_missing(self, node: NodeConfig, seen: set[str]) -> None:
        with self._lock:
            gone = [uid for uid, r in self._runners.items() if r.node.name == node.name and uid not in seen]
            for uid in gone:
                self._runners.pop(uid).request_stop(0, delete=False)

    def _finish_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            client.CoreV1Api(self.ctx.api).delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0, body={"gracePeriodSeconds": 0})
        except ApiException as err:
            if err.status != 404:
                log.warning("final delete of %s failed: %s", meta["name"], err.reason)

    def _shutdown(self) -> None:
        log.info("stopping every pod's processes")
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.request_stop(2.0, delete=False)
        for runner in runners:
            runner.join(timeout=30)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig of the control plane")
    parser.add_argument("--node", action="append", required=True, help="a node name (repeat for more nodes)")
    parser.add_argument("--gpus", type=int, default=1, help="nvidia.com/gpu capacity per node")
    parser.add_argument("--cpu", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--label", action="append", default=[], help="extra node label k=v (repeatable)")
    parser.add_argument("--state-dir", required=True, type=Path, help="pods' folders, logs and pid files")
    parser.add_argument("--pvc-root", type=Path, default=None, help="folder holding one folder per PVC claim name")
    parser.add_argument("--venv-bin", type=Path, default=Path(sys.executable).parent,
                        help="where the modelplane entry points live (default: this Python's bin)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    labels = dict(item.split("=", 1) for item in args.label)
    nodes = [NodeConfig(name=name, index=i + 1, gpus=args.gpus, cpu=args.cpu, memory=args.memory, labels=labels)
             for i, name in enumerate(args.node)]
    api = config.new_client_from_config(config_file=args.kubeconfig)
    admin = yaml.safe_load(Path(args.kubeconfig).read_text())
    args.state_dir.mkdir(parents=True, exist_ok=True)
    ctx = AgentContext(api=api, admin_kubeconfig=admin, state_dir=args.state_dir.resolve(),
                       venv_bin=args.venv_bin.resolve() if args.venv_bin.is_absolute() else args.venv_bin.absolute(),
                       pvc_root=args.pvc_root.resolve() if args.pvc_root else None)
    agent = NodeAgent(ctx, nodes)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run()


if __name__ == "__main__":
    main()
