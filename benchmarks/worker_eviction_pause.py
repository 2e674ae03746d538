"""Does freeing a model pause the others? A warm model's latency while another model is unloaded, vs alone.

One real ``hotset-worker`` holding two of the benchmark BERTs
(``bench_models``): the warm one is asked back to back throughout. Each round
loads the other model, waits, then measures the warm model's requests in a
window while nothing else happens ("alone") and in a window of the same length
that starts with an unload of the other model ("evicting"). With
``--baseline-src`` the same is measured on another checkout's worker (e.g. the
last landing, whose unload ran a full ``gc.collect()``), its rounds alternating
with this tree's. Target: p50 and p99 while evicting within 1.5x of alone.

Usage: .venv/bin/python benchmarks/worker_eviction_pause.py [--rounds 20] [--window 0.4] [--baseline-src CHECKOUT]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_models  # noqa: E402
import worker_under_thrash as thrash  # noqa: E402

WARM, OTHER = "m001", "m003"  # hidden 64 (fast to run) and hidden 256 (the biggest to free)


def measure(client: httpx.Client, seconds: float, during: threading.Event | None = None) -> list[float]:
    """Warm requests back to back for `seconds`; with `during`, starting once it is set."""
    if during is not None:
        during.wait(5)
    latencies = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        response = client.post("/predict", json={"model_id": WARM, "input_data": "a warm request"})
        response.raise_for_status()
        latencies.append(time.perf_counter() - started)
    return latencies


def one_round(url: str, window_s: float) -> tuple[list[float], list[float]]:
    with httpx.Client(base_url=url, timeout=30) as client, httpx.Client(base_url=url, timeout=30) as admin:
        admin.post(f"/v2/repository/models/{OTHER}/load").raise_for_status()
        time.sleep(0.2)
        alone = measure(client, window_s)
        started = threading.Event()

        def unload() -> None:
            started.set()
            admin.post(f"/v2/repository/models/{OTHER}/unload").raise_for_status()

        thread = threading.Thread(target=unload)
        thread.start()
        evicting = measure(client, window_s, started)
        thread.join()
        return alone, evicting


@contextlib.contextmanager
def worker(kind: str, store: Path, logs: Path) -> Iterator[str]:
    with thrash.target(kind, store, logs) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            client.post("/predict", json={"model_id": WARM, "input_data": "warm up"}).raise_for_status()
        yield url


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--window", type=float, default=0.4, help="seconds measured alone, and from each unload")
    parser.add_argument("--baseline-src", type=Path)
    args = parser.parse_args()
    kinds = ["worker"]
    if args.baseline_src:
        thrash.use_baseline(args.baseline_src.resolve())
        kinds.append("worker" + thrash.BASELINE_SUFFIX)
    store = bench_models.ensure_models()
    samples: dict[str, tuple[list[float], list[float]]] = {kind: ([], []) for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="eviction-pause-") as scratch, contextlib.ExitStack() as stack:
        urls = {kind: stack.enter_context(worker(kind, store, Path(scratch))) for kind in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                alone, evicting = one_round(urls[kind], args.window)
                samples[kind][0].extend(alone)
                samples[kind][1].extend(evicting)
    print("| worker | alone p50 ms | evicting p50 ms | p50 ratio | alone p99 ms | evicting p99 ms | p99 ratio | evicting max ms |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, (alone, evicting) in samples.items():
        a50, e50 = statistics.median(alone), statistics.median(evicting)
        a99, e99 = quantile(alone, 0.99), quantile(evicting, 0.99)
        print(f"| {kind} | {a50 * 1000:.1f} | {e50 * 1000:.1f} | {e50 / a50:.2f} | {a99 * 1000:.1f} | {e99 * 1000:.1f} | "
              f"{e99 / a99:.2f} | {max(evicting) * 1000:.0f} |")


if __name__ == "__main__":
    main()
