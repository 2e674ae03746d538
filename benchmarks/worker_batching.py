"""Dynamic batching on a DistilBERT-sized classifier: on, off, and Triton's dynamic batcher.

One model made here (``DistilBertForSequenceClassification``: hidden 768, 6
layers, 12 heads, the sample tokenizer's small vocabulary, random weights from
a fixed seed), saved with ``save_pretrained`` like a user's model, and served
three ways, each by a fresh server, whole runs alternating (the order flipped
each round):

- ``on``: ``hotset-worker``, the transformers worker with the task's default
  batching (32 rows, 2 ms);
- ``off``: the same worker and model with ``batching: {maxBatchSize: 1}``;
- ``triton``: the same weights in a Triton Python-backend model with
  ``dynamic_batching`` (max_batch_size 32, 2 ms queue delay; by default two
  instances of one torch thread each, the worker's own shape of two passes
  at once, ``--triton-instances``/``--triton-threads`` to change it; its ``execute``
  tokenizes and runs every request Triton hands it in one pass, the way
  batching is written for that backend), served through ``hotset-worker``
  and its real CPU Triton sidecar (``hotset-triton``), whose Python gets
  torch and transformers from a venv of Debian's Python that sees this
  project's packages (``build/triton-torch-venv``).

Every request is the same OIP v2 infer (``text``: BYTES [1, 1]) to the
worker, so the three differ only in what runs the model. Closed loop: C
clients drain one shared queue of requests (short review-like sentences of
3-12 words, seeded), by two harnesses in turn on the same server: httpx and
aiohttp clients (the client shares the two cores with the server; aiohttp's
costs about a quarter of httpx's CPU per request). Prints each run, then
throughput and latency at concurrency 32 and 1, with the ratios the issue's
targets name, per harness.

Single-request latency, on against off, is also measured interleaved: both
workers alive at once, one request at a time, alternating between them
request by request (the order flipped each pair), so a machine whose load
drifts between whole runs colours both alike. Twice: with the on worker
started first, then the off one: two processes (two copies of the weights)
differ by a fraction of a millisecond whatever their batching, and the one
started first tends to win (benchmarks/lone_request.py shows it within one
process), so the figure is the mean of the two orders.

Usage: .venv/bin/python benchmarks/worker_batching.py [--requests 640] [--single 100] [--rounds 2]
       [--targets on,off,triton]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hotset_testing.processes import free_port, spawn, wait_http  # noqa: E402
from hotset_testing.triton import start_tritonserver  # noqa: E402

VENV_BIN = Path(sys.executable).parent
ROOT = REPO / "build" / "bench-models" / "distilbert"
TRITON_VENV = REPO / "build" / "triton-torch-venv"
MODEL_ID = "distil"
MAX_BATCH = 32
DELAY_MS = 2

_BUILD = """
import sys
from pathlib import Path
import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification
from hotset_worker import samples

folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
vocab = samples._save_tokenizer(folder)
torch.manual_seed(0)
config = DistilBertConfig(vocab_size=vocab, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                          max_position_embeddings=128, num_labels=2,
                          id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
DistilBertForSequenceClassification(config).eval().save_pretrained(str(folder))
"""

TRITON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [{{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }}]
output [{{ name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] }}]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
instance_group [{{ kind: KIND_CPU count: {instances} }}]
parameters {{ key: "hf_folder" value {{ string_value: "{folder}" }} }}
parameters {{ key: "torch_threads" value {{ string_value: "{threads}" }} }}
"""

TRITON_MODEL_PY = '''import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForSequenceClassification, AutoTokenizer


class TritonPythonModel:
    """The same classifier as the transformers worker: every request Triton batched, in one pass."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        folder = parameters["hf_folder"]["string_value"]
        threads = int(parameters["torch_threads"]["string_value"])
        if threads > 0:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()

    def execute(self, requests):
        texts, sizes = [], []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            texts += [v.decode() if isinstance(v, bytes) else str(v) for v in values]
            sizes.append(len(values))
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.inference_mode():
            probabilities = torch.softmax(self.model(**batch).logits.float(), dim=-1).numpy()
        answers, start = [], 0
        for size in sizes:
            rows = probabilities[start:start + size].astype(np.float32)
            start += size
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("probabilities", rows)]))
        return answers
'''


def ensure_model() -> Path:
    folder = ROOT / "hf"
    if not (folder / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-c", _BUILD, str(folder)], check=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return folder


TRITON_SHAPE = {"instances": 2, "threads": 1}  # set from the command line in main()


def ensure_triton_model(hf: Path) -> Path:
    folder = ROOT / "triton" / MODEL_ID
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(TRITON_CONFIG.format(name=MODEL_ID, max_batch=MAX_BATCH,
                                                              delay_us=DELAY_MS * 1000, folder=hf, **TRITON_SHAPE))
    (folder / "1" / "model.py").write_text(TRITON_MODEL_PY)
    return folder


def ensure_triton_venv() -> Path:
    """A venv of Debian's Python (what the stub embeds) that sees this project's site-packages: the
    same torch and transformers, no second install (both are CPython 3.11, one ABI)."""
    if not (TRITON_VENV / "pyvenv.cfg").is_file():
        subprocess.run(["/usr/bin/python3.11", "-m", "venv", str(TRITON_VENV)], check=True)
    site = next(TRITON_VENV.glob("lib/python3*/site-packages"))
    ours = Path(sysconfig.get_paths()["purelib"])
    paths = [str(ours)]
    for pth in ours.glob("*.pth"):  # a thin venv points at a shared base this way
        for line in pth.read_text().splitlines():
            if line.strip() and not line.startswith(("import", "#")) and Path(line.strip()).is_dir():
                paths.append(line.strip())
    (site / "zz-hotset-bench.pth").write_text("\n".join(paths) + "\n")
    return TRITON_VENV


def store_file(folder: Path, name: str, entry: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"models": [{"id": MODEL_ID, "name": MODEL_ID, "version": "1", "memory": "400Mi",
                                            **entry}]}))
    return path


@contextlib.contextmanager
def target(kind: str, hf: Path, scratch: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(VENV_BIN / "hotset-worker"), "--port", str(port), "--memory-budget", "4Gi", "--log-level", "warning"]
    with contextlib.ExitStack() as stack:
        if kind == "triton":
            repository = scratch / f"repository-{port}"
            server = start_tritonserver(repository, log_dir=scratch,
                                        extra_env={"HOTSET_TRITON_PYTHONPATH": str(ensure_triton_venv())})
            stack.callback(server.stop)
            store = store_file(scratch, "triton", {"framework": "triton", "task": "tensor",
                                                   "source": ensure_triton_model(hf).as_uri()})
            argv += ["--triton-url", f"127.0.0.1:{server.http_port}", "--triton-repository", str(repository)]
        else:
            entry: dict[str, Any] = {"framework": "transformers", "task": "text-classification", "source": hf.as_uri()}
            if kind == "off":
                entry["batching"] = {"maxBatchSize": 1}
            store = store_file(scratch, kind, entry)
        argv += ["--model-store", str(store)]
        url = f"http://127.0.0.1:{port}"
        child = stack.enter_context(spawn(f"worker-{kind}", argv, scratch / f"worker-{kind}-{port}.log", url=url,
                                          own_session=True, stop_timeout_s=20))
        wait_http(child, "/v2/health/ready", 180)
        # Triton's stub imports torch and transformers first: a minute on a busy machine, past the
        # worker's default request timeout, so the load says how long it may take.
        httpx.post(f"{url}/v2/repository/models/{MODEL_ID}/load", headers={"X-Hotset-Timeout": "600"},
                   timeout=660).raise_for_status()
        yield url


def sentences(count: int, seed: int = 3) -> list[str]:
    from hotset_worker import samples

    words = [w for w in samples.WORDS if w.isalpha()]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(count)]


def body(text: str) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}


HARNESSES = ("httpx", "aiohttp")


async def closed_loop(url: str, texts: list[str], concurrency: int, harness: str = "httpx") -> dict[str, Any]:
    """C clients drain one shared queue of requests. Two harnesses, the same loop: httpx (what
    the other benchmarks use) and aiohttp (about a quarter of httpx's CPU per request: at c=32
    the client shares the two cores with the server it measures, and a cheaper one leaves more
    of them to the server)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)
    seconds: list[float] = []
    failed = 0
    path = f"/v2/models/{MODEL_ID}/infer"
    async with contextlib.AsyncExitStack() as stack:
        if harness == "aiohttp":
            session = await stack.enter_async_context(aiohttp.ClientSession(
                url, connector=aiohttp.TCPConnector(limit=concurrency), timeout=aiohttp.ClientTimeout(total=120)))

            async def post(text: str) -> int:
                async with session.post(path, json=body(text)) as answer:
                    await answer.read()
                    return answer.status
        else:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits))

            async def post(text: str) -> int:
                return (await client.post(path, json=body(text))).status_code

        async def one_client() -> None:
            nonlocal failed
            while not queue.empty():
                text = queue.get_nowait()
                started = time.perf_counter()
                try:
                    failed += await post(text) != 200
                except (httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError):
                    failed += 1
                seconds.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    seconds.sort()
    return {"concurrency": concurrency, "harness": harness, "requests": len(seconds), "failed": failed,
            "req_s": round(len(seconds) / wall, 1), "p50_ms": round(seconds[len(seconds) // 2] * 1000, 1),
            "p99_ms": round(seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))] * 1000, 1),
            "mean_ms": round(statistics.fmean(seconds) * 1000, 2)}


async def interleaved_single(urls: dict[str, str], texts: list[str]) -> dict[str, Any]:
    """One request at a time, to each target in turn (the order flipped each pair), one keep-alive
    connection per target: the single-request latency of two servers under the same moment's load."""
    names = list(urls)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    clients = {name: httpx.AsyncClient(base_url=url, timeout=120.0) for name, url in urls.items()}
    try:
        for name in names:  # warm: the connection and a first pass of each
            for text in texts[:5]:
                (await clients[name].post(f"/v2/models/{MODEL_ID}/infer", json=body(text))).raise_for_status()
        for index, text in enumerate(texts):
            for name in (names if index % 2 == 0 else list(reversed(names))):
                started = time.perf_counter()
                (await clients[name].post(f"/v2/models/{MODEL_ID}/infer", json=body(text))).raise_for_status()
                seconds[name].append(time.perf_counter() - started)
    finally:
        for client in clients.values():
            await client.aclose()
    first, second = names
    differences = sorted((a - b) * 1000 for a, b in zip(seconds[first], seconds[second]))

    def figures(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"mean_ms": round(statistics.fmean(ordered) * 1000, 2), "p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
                "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 2)}

    return {"pairs": len(texts), first: figures(seconds[first]), second: figures(seconds[second]),
            "mean_diff_ms": round(statistics.fmean(differences), 2),
            "median_pair_diff_ms": round(differences[len(differences) // 2], 2)}


def batch_figures(url: str) -> str:
    """Mean rows per pass from the worker's metrics (batching on only)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for name in ("hotset_batch_rows_sum", "hotset_batch_rows_count"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    if values.get("hotset_batch_rows_count"):
        return f"{values['hotset_batch_rows_sum'] / values['hotset_batch_rows_count']:.1f}"
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=640, help="requests per run at concurrency 32")
    parser.add_argument("--single", type=int, default=100, help="requests per run at concurrency 1")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--targets", default="on,off,triton")
    parser.add_argument("--triton-instances", type=int, default=2, help="Triton model instances")
    parser.add_argument("--triton-threads", type=int, default=1, help="torch threads per instance; 0: torch's default")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    TRITON_SHAPE.update(instances=args.triton_instances, threads=args.triton_threads)
    targets = [t for t in args.targets.split(",") if t]
    hf = ensure_model()
    texts = sentences(args.requests)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="batching-") as scratch:
        for round_index in range(args.rounds):
            for kind in (targets if round_index % 2 == 0 else list(reversed(targets))):
                with target(kind, hf, Path(scratch)) as url:
                    asyncio.run(closed_loop(url, texts[:40], 8))  # warm: first passes of each batch size
                    phases = [(args.concurrency, args.requests, harness) for harness in HARNESSES]
                    for concurrency, count, harness in phases + [(1, args.single, "httpx")]:
                        result = asyncio.run(closed_loop(url, texts[:count], concurrency, harness))
                        result.update(target=kind, round=round_index + 1)
                        if kind == "on" and concurrency > 1:
                            result["mean_rows_per_pass"] = batch_figures(url)
                        print(json.dumps(result), flush=True)
                        runs.append(result)
        paired: list[dict[str, Any]] = []
        if "on" in targets and "off" in targets and args.single:
            for first, second in (("on", "off"), ("off", "on")):  # which worker starts (and loads) first
                with target(first, hf, Path(scratch)) as one, target(second, hf, Path(scratch)) as two:
                    urls = {first: one, second: two}
                    paired.append({"started_first": first,
                                   **asyncio.run(interleaved_single({"on": urls["on"], "off": urls["off"]},
                                                                    texts[:args.single * 2]))})
                print(json.dumps({"interleaved_single": paired[-1]}), flush=True)
    report(runs, targets, args.concurrency)
    for each in paired:
        print(f"\nconcurrency 1, interleaved request by request ({each['pairs']} pairs, {each['started_first']} "
              f"started first): on mean {each['on']['mean_ms']:.2f} ms p50 {each['on']['p50_ms']:.2f} ms, off mean "
              f"{each['off']['mean_ms']:.2f} ms p50 {each['off']['p50_ms']:.2f} ms; on - off: mean "
              f"{each['mean_diff_ms']:+.2f} ms, median of the pairs' differences {each['median_pair_diff_ms']:+.2f} ms")
    if paired:
        both = statistics.fmean(each["median_pair_diff_ms"] for each in paired)
        print(f"on - off, the two orders' medians of pair differences averaged: {both:+.2f} ms (target within 1 ms)")
    if args.json_out:
        args.json_out.write_text(json.dumps(runs, indent=2))


def report(runs: list[dict[str, Any]], targets: list[str], concurrency: int) -> None:
    def mean(kind: str, c: int, key: str, harness: str = "httpx") -> float:
        values = [r[key] for r in runs if r["target"] == kind and r["concurrency"] == c and r["harness"] == harness]
        return statistics.fmean(values) if values else float("nan")

    print(f"\n| target | harness | c={concurrency} req/s (runs) | p50 ms | p99 ms | c=1 mean ms | c=1 p99 ms | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in targets:
        for harness in HARNESSES:
            each = ", ".join(f"{r['req_s']:.1f}" for r in runs
                             if r["target"] == kind and r["concurrency"] == concurrency and r["harness"] == harness)
            failed = sum(r["failed"] for r in runs if r["target"] == kind and r["harness"] == harness)
            single = (f"{mean(kind, 1, 'mean_ms'):.2f} | {mean(kind, 1, 'p99_ms'):.1f}" if harness == "httpx"
                      else "- | -")
            print(f"| {kind} | {harness} | {mean(kind, concurrency, 'req_s', harness):.1f} ({each}) | "
                  f"{mean(kind, concurrency, 'p50_ms', harness):.0f} | {mean(kind, concurrency, 'p99_ms', harness):.0f} | "
                  f"{single} | {failed} |")
    for harness in HARNESSES:
        if "on" in targets and "off" in targets:
            print(f"\n{harness}: on / off throughput at c={concurrency}: "
                  f"{mean('on', concurrency, 'req_s', harness) / mean('off', concurrency, 'req_s', harness):.2f}x "
                  f"(target >= 3); p99 on / off: "
                  f"{mean('on', concurrency, 'p99_ms', harness) / mean('off', concurrency, 'p99_ms', harness):.2f} "
                  f"(target <= 1)")
        if "on" in targets and "triton" in targets:
            print(f"{harness}: on / triton throughput at c={concurrency}: "
                  f"{mean('on', concurrency, 'req_s', harness) / mean('triton', concurrency, 'req_s', harness):.2f}x "
                  f"(target >= 1/1.2 = 0.83)")
    if "on" in targets and "off" in targets:
        print(f"c=1 mean on - off, whole runs: {mean('on', 1, 'mean_ms') - mean('off', 1, 'mean_ms'):+.2f} ms "
              "(target within 1 ms; the interleaved figure below is the fair one)")


if __name__ == "__main__":
    main()
