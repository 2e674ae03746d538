"""A closed-loop load generator: C clients replay one trace of seed ``/predict`` requests.

Each client takes the next request of the shared trace as soon as its last
one is answered, so the offered load adapts to the server (and two servers
see exactly the same sequence). aiohttp keeps the client's own CPU small on a
machine whose cores the servers share.
"""
from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from typing import Any, Sequence

import aiohttp

TEXT = "what a wonderful little movie"


@dataclasses.dataclass
class Outcome:
    model: str
    status: int
    seconds: float
    server_timing: str = ""
    error: str = ""


@dataclasses.dataclass
class RunResult:
    outcomes: list[Outcome]
    wall_s: float

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def failed(self) -> int:
        return len(self.outcomes) - len(self.ok)

    def failure_codes(self) -> dict[int, int]:
        codes: dict[int, int] = {}
        for outcome in self.outcomes:
            if outcome.status != 200:
                codes[outcome.status] = codes.get(outcome.status, 0) + 1
        return codes

    def percentile(self, q: float) -> float:
        values = sorted(o.seconds for o in self.outcomes)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    @property
    def throughput(self) -> float:
        return len(self.outcomes) / self.wall_s

    @property
    def ok_throughput(self) -> float:
        return len(self.ok) / self.wall_s

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.outcomes), "failed": self.failed, "codes": self.failure_codes(),
            "req_s": round(self.throughput, 2), "ok_req_s": round(self.ok_throughput, 2),
            "p50_ms": round(self.percentile(0.5) * 1000, 1), "p99_ms": round(self.percentile(0.99) * 1000, 1),
            "mean_ms": round(statistics.fmean(o.seconds for o in self.outcomes) * 1000, 1),
        }


async def replay(base_url: str, trace: Sequence[str], concurrency: int, timeout_s: float = 60.0,
                 input_data: Any = TEXT) -> RunResult:
    """Send `trace` with `concurrency` clients; every request's outcome in trace order."""
    outcomes: list[Outcome | None] = [None] * len(trace)
    cursor = iter(range(len(trace)))
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def client(session: aiohttp.ClientSession) -> None:
        for index in cursor:
            model = trace[index]
            started = time.perf_counter()
            try:
                async with session.post(f"{base_url}/predict", json={"model_id": model, "input_data": input_data}) as response:
                    body = await response.read()
                    outcomes[index] = Outcome(model, response.status, time.perf_counter() - started,
                                              response.headers.get("server-timing", ""),
                                              "" if response.status == 200 else body[:200].decode(errors="replace"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcomes[index] = Outcome(model, 599, time.perf_counter() - started, error=repr(exc))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return RunResult([o for o in outcomes if o is not None], wall)


def server_timing(header: str) -> dict[str, float]:
    """``Server-Timing: load;dur=41.2, infer;dur=3.1`` -> {"load": 0.0412, "infer": 0.0031} (seconds)."""
    result: dict[str, float] = {}
    for item in header.split(","):
        name, *params = [part.strip() for part in item.split(";")]
        for param in params:
            if param.startswith("dur="):
                result[name] = float(param[4:]) / 1000
    return result


def main() -> None:
    """`python benchmarks/loadgen.py URL --concurrency C --trace m1,m2,...`: replay a trace and print its summary
    (a flood from a process of its own, so that it does not share a GIL with what measures)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--trace", required=True, help="comma-separated model ids, in order")
    args = parser.parse_args()
    result = asyncio.run(replay(args.url, args.trace.split(","), args.concurrency))
    print(json.dumps(result.summary()))


if __name__ == "__main__":
    main()
