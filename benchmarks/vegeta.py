"""vegeta (Go, built once per machine from the module proxy) as a load generator beside the Python ones.

A Python client spends most of a millisecond of CPU per request; on this 2-core machine that is
taken from the server it measures. vegeta spends a few tens of microseconds, so a benchmark that
runs both sees how much of a latency figure was its own generator. Two shapes:

- an **open loop** (``rate > 0``): requests sent on schedule whatever the answers do;
- a **closed loop** (``rate == 0``, ``workers = C``): C workers each send their next request when
  the last one is answered, for ``seconds``: vegeta's ``-rate=0 -max-workers=C``.

Each call writes its targets (``POST /predict`` bodies) and results under `folder` and returns
vegeta's own report: latency percentiles in seconds, the share answered 2xx, the rate achieved.
"""
from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def default_vegeta() -> str:
    """scripts/install-go-tool.sh's vegeta (built once per machine from the Go module proxy), or ''."""
    try:
        return subprocess.run([str(ROOT / "scripts" / "install-go-tool.sh"), "vegeta", "github.com/tsenart/vegeta/v12",
                               "v12.13.0"], check=True, capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return ""


def predict(vegeta: str, urls: list[str], models: list[str], input_data: Any, seconds: float, folder: Path,
            name: str, rate: float = 0.0, workers: int = 8) -> dict[str, Any]:
    """One vegeta run of ``POST {urls[i]}/predict`` for ``models[i]`` (the list repeats when it runs
    out) for `seconds`: on schedule at `rate` a second, or, with ``rate=0``, a closed loop of
    `workers`."""
    targets = folder / f"{name}.targets"
    with targets.open("w") as out:
        for url, model in zip(urls, models):
            body = base64.b64encode(json.dumps({"model_id": model, "input_data": input_data}).encode()).decode()
            out.write(json.dumps({"method": "POST", "url": f"{url}/predict", "body": body,
                                  "header": {"Content-Type": ["application/json"]}}) + "\n")
    results = folder / f"{name}.bin"
    shape = ([f"-rate={int(rate)}/s", "-workers=32", "-max-workers=1024"] if rate > 0 else
             ["-rate=0", f"-workers={workers}", f"-max-workers={workers}"])
    subprocess.run([vegeta, "attack", "-format=json", f"-targets={targets}", *shape, f"-duration={seconds}s",
                    "-timeout=30s", f"-output={results}"], check=True, stdout=subprocess.DEVNULL)
    report = json.loads(subprocess.run([vegeta, "report", "-type=json", str(results)], check=True,
                                       capture_output=True, text=True).stdout)
    latencies = report["latencies"]
    return {"p50": latencies["50th"] / 1e9, "p99": latencies["99th"] / 1e9, "success": report["success"],
            "rate": report["rate"], "requests": report["requests"], "throughput": report["throughput"]}
