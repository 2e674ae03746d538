"""Model sources: the local source cache against a real S3 server, one download for many requests,
and Triton reading cached models in place against today's copy per load.

Starts the real pieces on loopback: MinIO (scripts/install-s3.sh), a tritonserver through
``hotset-triton``, and ``hotset-worker`` with a source cache; models are uploaded with boto3.

1. **Cache vs S3** (same files, same pod): a transformers model of about 200 MB per round, each
   round in a bucket of its own (so its first load is uncached): the first load downloads it
   from S3, the model is unloaded (evicted from memory), the second load reads the cache. Raw
   loopback S3 is faster than any real link, so the same is measured through a link shaped to
   1 Gbit/s (tests/hotset_testing/cutting_proxy.py), as a pod in a cluster would see S3; rounds
   alternate between the two links. Two harnesses side by side: the client's wall time of
   ``POST .../load`` and the worker's own ``hotset_model_load_seconds``. Each round also loads
   the same files from ``file://`` (read into memory rather than mapped), for reference.
2. **Ten requests, one download**: ten concurrent ``/predict`` for an uncached model; the
   worker's own counters say how many downloads happened.
3. **Triton, cache vs copy**: a Triton model with a 200 MB weight file, from ``file://``
   (staged by copying the folder, as before) and from ``s3://`` (cached, staged by linking),
   loads alternating; client wall time of ``POST .../load`` and the worker's own
   ``hotset_model_load_seconds`` side by side (two harnesses).
4. **Small models**: the twelve small BERTs of bench_models.py (0.5-7 MB), each loaded from
   ``file://`` and from the cache, alternating, medians by both harnesses.

Usage: .venv/bin/python benchmarks/model_sources.py [--rounds 3] [--mb 200] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

sys.path.insert(0, str(REPO / "benchmarks"))

import bench_models  # noqa: E402
from hotset_testing import s3_server  # noqa: E402
from hotset_testing.cutting_proxy import CuttingProxy  # noqa: E402
from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402
from hotset_testing.triton import start_tritonserver  # noqa: E402

GBIT_BYTES_PER_S = 125_000_000
LINKS = ("loopback", "shaped")  # raw loopback MinIO; through the proxy shaped to 1 Gbit/s


def build_transformers_model(folder: Path, megabytes: int) -> None:
    """A BERT-base-shaped classifier (hidden 768, 12 heads) of about `megabytes`, with as many layers
    as that takes (4 for 200 MB), random weights with a fixed seed, and the sample's tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    samples = REPO / "build" / "models" / "sentiment"
    torch.manual_seed(0)
    hidden, vocab = 768, 30_000
    per_layer = 12 * hidden * hidden + 13 * hidden  # attention, feed-forward (4x), norms, biases
    layers = max(1, round((megabytes * 2**20 / 4 - vocab * hidden) / per_layer))
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=12,
                        intermediate_size=4 * hidden, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (samples / name).exists():
            shutil.copy(samples / name, folder / name)


def build_triton_model(folder: Path, megabytes: int) -> None:
    """The iris sample with a `megabytes` weight file beside its model.py (what copying costs)."""
    shutil.copytree(REPO / "build" / "models" / "iris", folder)
    with open(folder / "1" / "weights.bin", "wb") as out:
        block = bytes(range(256)) * 4096
        for _ in range(megabytes):
            out.write(block)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@contextlib.contextmanager
def worker(store: Path, cache: Path, s3: Any, triton: Any, log: Path) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "hotset_worker.main", "--model-store", str(store), "--host", "127.0.0.1",
               "--port", str(port), "--memory-budget", "6Gi", "--triton-url", triton.url,
               "--triton-repository", str(triton.repository), "--pod-name", "bench", "--min-residency-s", "0",
               "--log-level", "warning", "--source-cache", str(cache), "--source-cache-bytes", "8Gi",
               "--s3-endpoint", s3.endpoint, "--request-timeout-s", "300"]
    with spawn("worker", command, log, env={"HF_HUB_OFFLINE": "1"}, url=f"http://127.0.0.1:{port}",
               own_session=True, stop_timeout_s=20) as process:
        wait_http(process, "/v2/health/ready", 180)
        yield process.url


def load_seconds(client: httpx.Client, model: str) -> float:
    started = time.perf_counter()
    answer = client.post(f"/v2/repository/models/{model}/load")
    answer.raise_for_status()
    return time.perf_counter() - started


def unload(client: httpx.Client, model: str) -> None:
    client.post(f"/v2/repository/models/{model}/unload").raise_for_status()


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    results: dict[str, Any] = {}
    try:
        results = run(work, args.rounds, args.mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


def run(work: Path, rounds: int, megabytes: int) -> dict[str, Any]:
    transformers_model, triton_model = work / "bert", work / "iris-big"
    build_transformers_model(transformers_model, megabytes)
    build_triton_model(triton_model, megabytes)
    print(f"models: transformers {folder_bytes(transformers_model) / 2**20:.0f} MiB, "
          f"triton {folder_bytes(triton_model) / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.1f}")
    with s3_server.running(work / "s3") as s3:
        target = urlsplit(s3.endpoint)
        with CuttingProxy(target.hostname or "127.0.0.1", target.port or 80).running() as link:
            link.rate = GBIT_BYTES_PER_S
            s3.make_bucket("warm-up", public=True)
            s3.upload_folder("warm-up", "bert/", transformers_model)
            models = [{"id": "warm-up", "framework": "transformers", "task": "text-classification", "memory": "600Mi",
                       "source": {"uri": "s3://warm-up/bert"}},
                      {"id": "bert-file", "framework": "transformers", "task": "text-classification", "memory": "600Mi",
                       "source": transformers_model.as_uri()}]
            for index in range(rounds):
                for kind, endpoint in zip(LINKS, ("", link.url)):
                    bucket = f"round-{index}-{kind}"
                    s3.make_bucket(bucket, public=True)
                    s3.upload_folder(bucket, "bert/", transformers_model)
                    source: dict[str, Any] = {"uri": f"s3://{bucket}/bert"}
                    if endpoint:
                        source["endpoint"] = endpoint
                    models.append({"id": f"bert-{index}-{kind}", "framework": "transformers",
                                   "task": "text-classification", "memory": "600Mi", "source": source})
            s3.make_bucket("ten", public=True)
            s3.upload_folder("ten", "bert/", transformers_model)
            models.append({"id": "ten", "framework": "transformers", "task": "text-classification",
                           "memory": "600Mi", "source": {"uri": "s3://ten/bert"}})
            s3.make_bucket("triton", public=True)
            s3.upload_folder("triton", "iris/", triton_model)
            models.append({"id": "iris-copied", "framework": "triton", "memory": "64Mi", "source": triton_model.as_uri()})
            models.append({"id": "iris-cached", "framework": "triton", "memory": "64Mi",
                           "source": {"uri": "s3://triton/iris"}})
            models += small_models(s3)
            store = work / "models.json"
            store.write_text(json.dumps({"models": models}))
            triton = start_tritonserver(work / "repository", log_dir=work)
            try:
                with worker(store, work / "cache", s3, triton, work / "worker.log") as url, \
                        httpx.Client(base_url=url, timeout=600) as client:
                    return {"cache_vs_s3": cache_vs_s3(client, rounds),
                            "ten_requests": ten_requests(client),
                            "triton": triton_cache_vs_copy(client, rounds),
                            "small": small_loads(client, rounds)}
            finally:
                triton.stop()


def timed_load(client: httpx.Client, model: str) -> tuple[float, float]:
    """One load, by two harnesses: the client's wall time of ``POST .../load`` and the worker's own
    ``hotset_model_load_seconds`` (its load thread: fetch, framework load, measure)."""
    before = metric(client, "hotset_model_load_seconds_sum", model=model)
    wall = load_seconds(client, model)
    return wall, metric(client, "hotset_model_load_seconds_sum", model=model) - before


def cache_vs_s3(client: httpx.Client, rounds: int) -> dict[str, Any]:
    print("\n1. second load of an evicted model (cache) vs its first load (S3), same files, same pod")
    for model in ("warm-up", "warm-up", "bert-file"):  # imports, first S3 client, first mapped load: not measured
        load_seconds(client, model)
        unload(client, model)
    loads: dict[str, dict[str, list[float]]] = {
        f"{kind} {which}": {"wall": [], "worker": []}
        for kind in LINKS for which in ("first", "second")} | {"file copy": {"wall": [], "worker": []}}
    print(f"{'link':>9} {'round':>5} | {'first (S3) s':>16} | {'second (cache) s':>16} | {'ratio':>13}")
    print(f"{'':>9} {'':>5} | {'wall':>7} {'worker':>8} | {'wall':>7} {'worker':>8} | {'wall':>6} {'worker':>6}")
    for index in range(rounds):
        for kind in LINKS:  # whole rounds alternate between the links
            model = f"bert-{index}-{kind}"
            first = timed_load(client, model)
            unload(client, model)
            second = timed_load(client, model)
            unload(client, model)
            for which, figures in (("first", first), ("second", second)):
                loads[f"{kind} {which}"]["wall"].append(figures[0])
                loads[f"{kind} {which}"]["worker"].append(figures[1])
            print(f"{kind:>9} {index:>5} | {first[0]:7.3f} {first[1]:8.3f} | {second[0]:7.3f} {second[1]:8.3f} | "
                  f"{first[0] / second[0]:5.1f}x {first[1] / second[1]:5.1f}x")
        copied = timed_load(client, "bert-file")  # the same files read into memory, as file:// sources are
        unload(client, "bert-file")
        loads["file copy"]["wall"].append(copied[0])
        loads["file copy"]["worker"].append(copied[1])
    figures: dict[str, Any] = {"loads": loads}
    print(f"\nmedians over {rounds} rounds, two harnesses:")
    print(f"{'link':>9} | {'first (S3) wall/worker s':>25} | {'second (cache) wall/worker s':>29} | "
          f"{'ratio wall':>10} {'ratio worker':>12}")
    for kind in LINKS:
        first, second = loads[f"{kind} first"], loads[f"{kind} second"]
        ratios = {harness: statistics.median(first[harness]) / statistics.median(second[harness])
                  for harness in ("wall", "worker")}
        figures[kind] = {"ratio_of_medians": ratios}
        print(f"{kind:>9} | {statistics.median(first['wall']):12.3f} {statistics.median(first['worker']):12.3f} | "
              f"{statistics.median(second['wall']):14.3f} {statistics.median(second['worker']):14.3f} | "
              f"{ratios['wall']:9.1f}x {ratios['worker']:11.1f}x")
    copied = loads["file copy"]
    print(f"the same files from file:// (read into memory, not mapped): {statistics.median(copied['wall']):.3f} s wall, "
          f"{statistics.median(copied['worker']):.3f} s worker")
    hits = metric(client, "hotset_source_cache_hits_total")
    print(f"cache hits counted by the worker: {hits:.0f}")
    for kind in LINKS:  # what the downloads achieved, from the worker's own counters
        nbytes = sum(metric(client, "hotset_source_download_bytes_total", model=f"bert-{i}-{kind}") for i in range(rounds))
        seconds = sum(metric(client, "hotset_source_download_seconds_sum", model=f"bert-{i}-{kind}") for i in range(rounds))
        figures[kind]["download_mb_per_s"] = nbytes / max(seconds, 1e-9) / 1e6
        print(f"{kind:>9} downloads: {nbytes / 1e6:.0f} MB in {seconds:.1f} s = {nbytes / max(seconds, 1e-9) / 1e6:.0f} MB/s")
    return figures


def ten_requests(client: httpx.Client) -> dict[str, Any]:
    print("\n2. ten concurrent requests for one uncached model")

    def predict(_: int) -> tuple[int, float]:
        started = time.perf_counter()
        answer = client.post("/predict", json={"model_id": "ten", "input_data": "a wonderful little model"})
        return answer.status_code, time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(predict, range(10)))
    downloads = metric(client, "hotset_source_fetches_total", model="ten", result="download")
    fetches = metric(client, "hotset_source_fetches_total", model="ten")
    answered = sum(1 for code, _ in answers if code == 200)
    latencies = sorted(seconds for _, seconds in answers)
    print(f"answered {answered}/10; downloads {downloads:.0f} (fetches {fetches:.0f}); "
          f"latency min {latencies[0]:.2f}s, max {latencies[-1]:.2f}s")
    return {"answered": answered, "downloads": downloads, "fetches": fetches, "latency_s": latencies}


def triton_cache_vs_copy(client: httpx.Client, rounds: int) -> dict[str, Any]:
    print("\n3. Triton model load: linked from the cache vs copied per load (200 MB weight file)")
    load_seconds(client, "iris-cached")  # its download, and Triton's first Python-backend start
    unload(client, "iris-cached")
    load_seconds(client, "iris-copied")
    unload(client, "iris-copied")
    wall: dict[str, list[float]] = {"iris-copied": [], "iris-cached": []}
    server: dict[str, list[float]] = {"iris-copied": [], "iris-cached": []}
    for _ in range(rounds + 2):
        for model in ("iris-copied", "iris-cached"):  # whole loads alternating
            before = metric(client, "hotset_model_load_seconds_sum", model=model)
            wall[model].append(load_seconds(client, model))
            server[model].append(metric(client, "hotset_model_load_seconds_sum", model=model) - before)
            unload(client, model)
    figures = {}
    print(f"{'model':>12} {'client wall s (median)':>23} {'worker load s (median)':>23}")
    for model in wall:
        figures[model] = {"wall_s": wall[model], "worker_s": server[model]}
        print(f"{model:>12} {statistics.median(wall[model]):23.3f} {statistics.median(server[model]):23.3f}")
    ratio_wall = statistics.median(wall["iris-copied"]) / statistics.median(wall["iris-cached"])
    ratio_server = statistics.median(server["iris-copied"]) / statistics.median(server["iris-cached"])
    print(f"copy / cache: {ratio_wall:.2f}x (client), {ratio_server:.2f}x (worker)")
    figures["ratio_wall"], figures["ratio_worker"] = ratio_wall, ratio_server
    return figures


def small_models(s3: Any) -> list[dict[str, Any]]:
    """The twelve small BERTs of bench_models.py (0.5-7 MB), each from file:// and from a bucket."""
    store = bench_models.ensure_models()
    s3.make_bucket("small", public=True)
    entries = []
    for entry in json.loads(store.read_text())["models"]:
        folder = Path(urlsplit(entry["source"]).path)
        s3.upload_folder("small", f"{entry['id']}/", folder)
        for kind, source in (("file", entry["source"]), ("s3", {"uri": f"s3://small/{entry['id']}"})):
            entries.append({"id": f"small-{kind}-{entry['id']}", "framework": "transformers",
                            "task": "text-classification", "memory": entry["memory"], "source": source})
    return entries


def small_loads(client: httpx.Client, rounds: int) -> dict[str, Any]:
    print("\n4. small models (twelve BERTs of 0.5-7 MB): a load from file:// and from the cache, alternating")
    ids = bench_models.model_ids()
    for model_id in ids:  # downloads, first architecture import: not measured
        for kind in ("file", "s3"):
            load_seconds(client, f"small-{kind}-{model_id}")
            unload(client, f"small-{kind}-{model_id}")
    loads: dict[str, dict[str, list[float]]] = {kind: {"wall": [], "worker": []} for kind in ("file", "s3")}
    for _ in range(rounds):
        for model_id in ids:
            for kind in ("file", "s3"):
                wall, worker_s = timed_load(client, f"small-{kind}-{model_id}")
                unload(client, f"small-{kind}-{model_id}")
                loads[kind]["wall"].append(wall)
                loads[kind]["worker"].append(worker_s)
    print(f"{'source':>22} {'loads':>6} {'wall ms (median)':>17} {'worker ms (median)':>19}")
    for kind, label in (("file", "file:// (read)"), ("s3", "s3:// cached (mapped)")):
        print(f"{label:>22} {len(loads[kind]['wall']):>6} {1000 * statistics.median(loads[kind]['wall']):17.1f} "
              f"{1000 * statistics.median(loads[kind]['worker']):19.1f}")
    return loads


if __name__ == "__main__":
    main()
