"""A lone request with batching on against off, in one worker process: what the batcher costs it.

worker_batching.py's interleaved phase compares two worker processes; a
difference of a millisecond or two there can be the two processes (their
memory, their cores), not the batcher. Here one real worker app (main.build_app,
the real transformers worker) serves the DistilBERT-sized classifier twice,
``on`` (the default batching) and ``off`` (``maxBatchSize: 1``), and single
requests alternate between them, the order flipped each pair, in two
harnesses: ``DataPlane.predict`` called on the app's own event loop (no HTTP:
the batcher's own cost), and OIP v2 infer over real HTTP to the app served
by uvicorn in this process (what a client sees). Reported: each one's median
and the median of the pairs' differences (on - off). The two are two copies
of the same weights, and the copy loaded first tends to be a fraction of a
millisecond faster whatever its batching (``--load-order off,on`` flips the
sign): run both orders. ``--stand-in``: the batcher's bookkeeping alone, on
ballast stand-in models whose pass does no work, in microseconds.

Usage: .venv/bin/python benchmarks/lone_request.py [--pairs 200] [--model-folder DIR] [--load-order on,off]
       .venv/bin/python benchmarks/lone_request.py --stand-in [--pairs 3000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_batching  # noqa: E402  (the same model and sentences)


def build_model(folder: Path) -> Path:
    if not (folder / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-c", worker_batching._BUILD, str(folder)], check=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return folder


def make_app(hf: Path, scratch: Path) -> tuple[Any, Any]:
    """The real worker app serving `on` and `off`, and its DataPlane."""
    from hotset_worker import main

    entry = {"framework": "transformers", "task": "text-classification", "source": hf.as_uri(), "version": "1",
             "memory": "400Mi"}
    store = scratch / "store.json"
    store.write_text(json.dumps({"models": [{**entry, "id": "on", "name": "on"},
                                            {**entry, "id": "off", "name": "off", "batching": {"maxBatchSize": 1}}]}))
    return with_dataplane(lambda: main.build_app(main.parse_settings(
        ["--model-store", str(store), "--memory-budget", "2Gi", "--log-level", "warning"], {})))


def with_dataplane(build: Callable[[], Any]) -> tuple[Any, Any]:
    """The app `build` makes, and its DataPlane: the plain ASGI inference layer in front of the
    FastAPI app holds it (``inference_asgi.InferenceRoutes.dataplane``), under the caller check
    where there is one (``RequireCaller.app``)."""
    app = served = build()
    while not hasattr(served, "dataplane"):
        served = served.app
    return app, served.dataplane


LOAD_ORDER = ["on", "off"]  # --load-order: which copy loads first (and so where its weights lie)


def alternate(call: Callable[[str, str], float], texts: list[str]) -> dict[str, Any]:
    """`call(name, text)` returns its seconds; both models warmed first, the order flipped each pair."""
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    for name in ("on", "off"):
        for text in texts[:5]:
            call(name, text)
    for index, text in enumerate(texts):
        for name in (("on", "off") if index % 2 == 0 else ("off", "on")):
            seconds[name].append(call(name, text))
    differences = [(a - b) * 1000 for a, b in zip(seconds["on"], seconds["off"])]
    return {"pairs": len(texts), "on_p50_ms": round(statistics.median(seconds["on"]) * 1000, 3),
            "off_p50_ms": round(statistics.median(seconds["off"]) * 1000, 3),
            "median_pair_diff_ms": round(statistics.median(differences), 3)}


async def measure(app: Any, dataplane: Any, texts: list[str], harnesses: list[str]) -> dict[str, Any]:
    """Serve `app` with uvicorn on this loop; the DataPlane harness runs its requests on this very
    loop (from a thread, one at a time, as a client would), the HTTP one from a thread's client."""
    from hotset_testing.worker_server import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    loop = asyncio.get_running_loop()
    while not server.started:
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {}
    try:
        def run() -> None:
            with httpx.Client(base_url=url, timeout=660) as client:
                for name in LOAD_ORDER:
                    client.post(f"/v2/repository/models/{name}/load",
                                headers={"X-Hotset-Timeout": "600"}).raise_for_status()

                def direct(name: str, text: str) -> float:
                    started = time.perf_counter()
                    asyncio.run_coroutine_threadsafe(dataplane.predict(name, text), loop).result()
                    return time.perf_counter() - started

                def over_http(name: str, text: str) -> float:
                    started = time.perf_counter()
                    client.post(f"/v2/models/{name}/infer", json=worker_batching.body(text)).raise_for_status()
                    return time.perf_counter() - started

                for harness in harnesses:
                    results[harness] = alternate(direct if harness == "dataplane" else over_http, texts)
                    print(json.dumps({"harness": harness, **results[harness]}), flush=True)

        await asyncio.to_thread(run)
    finally:
        server.should_exit = True
        await serving
    return results


async def stand_in(pairs: int, scratch: Path) -> dict[str, Any]:
    """The batcher's fixed cost alone: ballast stand-in models (a forward pass of no work), on
    and off in one app, ``DataPlane.predict`` timed on the loop itself (no thread of ours between)."""
    from hotset_testing import ballast_framework as ballast
    from hotset_testing.worker_server import ballast_app

    _, dataplane = with_dataplane(lambda: ballast_app(ballast.catalog(
        scratch, {"on": {"size": 1, "batching": {"maxBatchSize": 32, "maxDelayMs": 2}}, "off": {"size": 1}}),
        budget=2**30))
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    for index in range(pairs + 50):
        for name in (("on", "off") if index % 2 == 0 else ("off", "on")):
            started = time.perf_counter()
            await dataplane.predict(name, [1])
            if index >= 50:  # the first: loads and warm-up
                seconds[name].append(time.perf_counter() - started)
    dataplane.close()
    differences = [(a - b) * 1e6 for a, b in zip(seconds["on"], seconds["off"])]
    return {"harness": "stand-in", "pairs": pairs, "on_p50_us": round(statistics.median(seconds["on"]) * 1e6, 1),
            "off_p50_us": round(statistics.median(seconds["off"]) * 1e6, 1),
            "median_pair_diff_us": round(statistics.median(differences), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--model-folder", type=Path, default=worker_batching.ROOT / "hf")
    parser.add_argument("--harness", default="dataplane,http", help="dataplane, http or both, in this order")
    parser.add_argument("--load-order", default="on,off", help="which copy loads first: on,off or off,on")
    parser.add_argument("--stand-in", action="store_true",
                        help="only the batcher's fixed cost, on ballast stand-ins (no model, no HTTP)")
    args = parser.parse_args()
    if args.stand_in:
        print(f"load average before: {os.getloadavg()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="lone-") as scratch:
            print(json.dumps(asyncio.run(stand_in(args.pairs, Path(scratch)))), flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
        return
    LOAD_ORDER[:] = args.load_order.split(",")
    hf = build_model(args.model_folder)
    texts = worker_batching.sentences(args.pairs)
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lone-") as scratch:
        app, dataplane = make_app(hf, Path(scratch))
        asyncio.run(measure(app, dataplane, texts, [h for h in args.harness.split(",") if h]))
    print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
