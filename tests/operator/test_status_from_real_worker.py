"""Status comes from what a real worker reports, and a deleted model leaves the workers; a long
download shows in the ServedModel (Ready=False Downloading, copies[].progress) until it is Ready.

A real `hotset-worker` process follows the catalog feed of the pool, as a
pool pod does (``HOTSET_CATALOG_URL``). A Pod object stands for it in the API
server: with no kubelet here, the test writes the pod's status (Running,
Ready, podIP 127.0.0.1) the way a kubelet would.
"""
from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from hotset_operator import workloads
from hotset_testing import s3_server
from hotset_testing.cutting_proxy import CuttingProxy
from hotset_testing.operator_harness import Cluster, operator_config, running_operator, served_model, \
    STAND_IN_TRUST, stand_in_pod, wait_for
from hotset_testing.processes import free_port
from hotset_testing.worker_server import REPO, worker_process
from hotset_worker import samples


def test_copies_and_ready_follow_the_worker_and_delete_unloads(cluster: Cluster, tmp_path: Path) -> None:
    store = samples.generate(REPO / "build" / "models")
    source = next(m["source"] for m in json.loads(store.read_text())["models"] if m["id"] == "sentiment")
    port = free_port()
    config = operator_config(cluster.namespace, worker_port=port, worker_trust=STAND_IN_TRUST)
    with running_operator(config):
        cluster.apply(served_model("sentiment", source={"uri": source}, memory="17Mi", replicas={"min": 1, "max": 2}))
        waiting = wait_for(lambda: cluster.condition("sentiment", "Ready"), "a Ready condition")
        assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForCopies")

        stand_in_pod(cluster, "pool-pod-a")
        args = ["--catalog-url", workloads.catalog_url(config, cluster.namespace), "--min-residency-s", "0"]
        with worker_process(args, env={"HOTSET_POD_NAME": "pool-pod-a", "HF_HUB_OFFLINE": "1"}, port=port) as url:
            # Like the router: never place on a pod before it is ready, then ask it to load.
            wait_for(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "the worker ready", timeout=60)
            wait_for(lambda: httpx.get(f"{url}/v2/models/sentiment").status_code == 200, "sentiment in its catalog")
            assert httpx.post(f"{url}/v2/repository/models/sentiment/load", timeout=120).status_code == 200
            ready = wait_for(lambda: (c := cluster.condition("sentiment", "Ready")) and c["status"] == "True" and c,
                             "Ready=True")
            assert ready["reason"] == "CopiesReady"
            status = cluster.get("servedmodel", "sentiment")["status"]
            assert status["readyReplicas"] == 1
            [copy] = status["copies"]
            assert (copy["pod"], copy["state"]) == ("pool-pod-a", "READY") and copy["bytes"] > 0

            # Deleting needs no operator round trip: the model leaves the pool's catalog, and the
            # worker unloads its idle copy by itself.
            cluster.kubectl("delete", "servedmodel", "sentiment", "--timeout=30s")
            wait_for(lambda: "sentiment" not in httpx.get(f"{url}/models").json()["loaded_models"],
                     "the copy unloaded by the worker", timeout=30)


def test_a_long_download_shows_in_the_servedmodel_status_then_ready(cluster: Cluster, tmp_path: Path) -> None:
    """What ``kubectl describe servedmodel`` says while a copy's source downloads: the Ready
    condition is ``Downloading`` naming the pod and ``downloading N of M MiB``, and the copy's
    ``progress`` says the same and moves; once loaded, CopiesReady and no progress.

    The model is the sample sentiment model plus 6 MiB of padding (a file transformers never
    reads) in a real MinIO bucket; the worker reaches it through a TCP proxy standing in for a
    slow link (1 MiB/s: about six seconds of download, several of the operator's polls)."""
    store = samples.generate(REPO / "build" / "models")
    folder = Path(next(m["source"] for m in json.loads(store.read_text())["models"]
                       if m["id"] == "sentiment").removeprefix("file://"))
    with s3_server.running(tmp_path / "s3") as s3:
        s3.make_bucket("models", public=True)  # anonymous reads: the worker signs nothing
        total = s3.upload_folder("models", "sentiment/", folder)
        s3.client().put_object(Bucket="models", Key="sentiment/padding.bin", Body=b"\x00" * (6 * 2**20))
        total_mib = f"{(total + 6 * 2**20) / 2**20:.1f}"
        target = urlsplit(s3.endpoint)
        with CuttingProxy(target.hostname, target.port).running() as slow:
            slow.rate = 2**20
            port = free_port()
            config = operator_config(cluster.namespace, worker_port=port, worker_trust=STAND_IN_TRUST,
                                     s3_endpoint=slow.url)  # the pool's own endpoint: allowed, plain http or not
            with running_operator(config):
                cluster.apply(served_model("sentiment", source={"uri": "s3://models/sentiment"}, memory="17Mi",
                                           replicas={"min": 1, "max": 1}))
                wait_for(lambda: (c := cluster.condition("sentiment", "Ready")) and c["reason"] == "WaitingForCopies",
                         "Ready=False, WaitingForCopies")
                stand_in_pod(cluster, "pool-pod-a")
                args = ["--catalog-url", workloads.catalog_url(config, cluster.namespace), "--min-residency-s", "0",
                        "--source-cache", str(tmp_path / "cache"), "--source-cache-bytes", "1Gi",
                        "--s3-endpoint", slow.url]
                with worker_process(args, env={"HOTSET_POD_NAME": "pool-pod-a", "HF_HUB_OFFLINE": "1"},
                                    port=port) as url, \
                        concurrent.futures.ThreadPoolExecutor(1) as loads:
                    wait_for(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "the worker ready",
                             timeout=60)
                    wait_for(lambda: httpx.get(f"{url}/v2/models/sentiment").status_code == 200,
                             "sentiment in its catalog")
                    load = loads.submit(httpx.post, f"{url}/v2/repository/models/sentiment/load", timeout=120)

                    shown = rf"downloading \d+\.\d of {re.escape(total_mib)} MiB"
                    seen: set[str] = set()

                    def downloading() -> dict | None:
                        ready = cluster.condition("sentiment", "Ready")
                        copies = (cluster.get("servedmodel", "sentiment").get("status") or {}).get("copies") or []
                        if ready is None or ready["reason"] != "Downloading" or not copies:
                            return None
                        seen.add(copies[0].get("progress", ""))
                        return ready if len(seen) >= 2 else None  # moved while we watched

                    ready = wait_for(downloading, "Ready=False, Downloading, its progress moving", timeout=60)
                    assert ready["status"] == "False"
                    assert re.fullmatch(rf"0 of 1 required copies ready; pod pool-pod-a: {shown}", ready["message"]), \
                        ready["message"]
                    assert all(re.fullmatch(shown, text) for text in seen), seen
                    [copy] = cluster.get("servedmodel", "sentiment")["status"]["copies"]
                    assert (copy["pod"], copy["state"]) == ("pool-pod-a", "LOADING")
                    described = cluster.kubectl("describe", "servedmodel", "sentiment").stdout
                    assert re.search(rf"Downloading.*{shown}|{shown}.*Downloading", described, re.S), described

                    assert load.result().status_code == 200
                    done = wait_for(lambda: (c := cluster.condition("sentiment", "Ready")) and c["status"] == "True"
                                    and c, "Ready=True")
                    assert done["reason"] == "CopiesReady"
                    [copy] = cluster.get("servedmodel", "sentiment")["status"]["copies"]
                    assert copy["state"] == "READY" and "progress" not in copy
                    assert slow.answered >= total  # the bytes really crossed the slow link
