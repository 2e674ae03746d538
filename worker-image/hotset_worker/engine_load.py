"""What the pod's vLLM engines say of their own load: read from each engine's /metrics, reported and exported.

A router that counts only its own in-flight requests does not see what an
engine holds: requests other routers sent, how many of them wait for the
scheduler, how full the KV cache is, which adapters are resident. vLLM's
engine publishes all of that on its ``/metrics``; so every ``interval_s``
the sampler reads each live engine's (on the event loop, through the
engines' aiohttp session: no thread, no lock held across the call) and keeps
the latest figures, which go

- to the routers in every ``/status`` report (``WorkerStatus.engines``,
  ``wire.EngineLoad``): the prefix-aware choice among a model's copies
  scores queue depth and KV-cache use by them (router prefix_routing.py);
- to Prometheus as the Gateway API Inference Extension's model-server
  metrics, in the names its protocol gives for vLLM
  (``hotset_common.metrics.MODEL_SERVER_*``): one series per pod, all its
  engines together (queue and running summed, KV-cache use as blocks in use
  over all blocks, the adapters resident in any), since an endpoint picker
  scrapes the pod as one model server and reads one series.

Only the few series needed are parsed (lines picked by name first, then
prometheus_client's parser on those): an engine's exposition is tens of
kilobytes, and the event loop carries every request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Iterable

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from hotset_common import metrics as names
from hotset_common.wire import EngineLoad

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
# A busy engine's API server answers /metrics between its steps: on two loaded cores that took over
# 2 s (every read timed out and the figures read as idle in the middle of 64 requests).
READ_TIMEOUT_S = 10.0
_WANTED = (names.MODEL_SERVER_WAITING, names.MODEL_SERVER_RUNNING, names.MODEL_SERVER_KV_CACHE_USAGE,
           names.MODEL_SERVER_LORA_INFO, names.ENGINE_CACHE_CONFIG_INFO, names.ENGINE_PREFIX_CACHE_QUERIES,
           names.ENGINE_PREFIX_CACHE_HITS)


def parse(model: str, text: str) -> EngineLoad:
    """An engine's exposition as its figures (series it lacks read as 0; several engines in one
    server, vLLM's data parallelism, are summed)."""
    lines = [line for line in text.splitlines() if line.startswith(_WANTED) or
             (line.startswith("# ") and any(name in line for name in _WANTED))]
    figures: dict[str, float] = {}
    blocks = block_size = max_lora = 0
    running_adapters: list[str] = []
    waiting_adapters: list[str] = []
    latest_lora = -1.0
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == names.ENGINE_CACHE_CONFIG_INFO:
                blocks += int(float(sample.labels.get("num_gpu_blocks") or 0))
                block_size = int(float(sample.labels.get("block_size") or 0)) or block_size
            elif sample.name == names.MODEL_SERVER_LORA_INFO:
                if sample.value > latest_lora:  # the latest series is the current one (its value: its time)
                    latest_lora = sample.value
                    max_lora = int(sample.labels.get("max_lora") or 0)
                    running_adapters = _names(sample.labels.get("running_lora_adapters", ""))
                    waiting_adapters = _names(sample.labels.get("waiting_lora_adapters", ""))
            elif sample.name.endswith("_created"):
                continue
            else:
                figures[sample.name.removesuffix("_total")] = figures.get(sample.name.removesuffix("_total"), 0.0) + \
                    sample.value
    return EngineLoad(model=model, waiting=int(figures.get(names.MODEL_SERVER_WAITING, 0)),
                      running=int(figures.get(names.MODEL_SERVER_RUNNING, 0)),
                      kv_cache_usage=min(1.0, max(0.0, figures.get(names.MODEL_SERVER_KV_CACHE_USAGE, 0.0))),
                      kv_cache_blocks=blocks, block_size=block_size,
                      prefix_cache_queries=figures.get(names.ENGINE_PREFIX_CACHE_QUERIES, 0.0),
                      prefix_cache_hits=figures.get(names.ENGINE_PREFIX_CACHE_HITS, 0.0),
                      max_lora=max_lora, running_lora_adapters=running_adapters,
                      waiting_lora_adapters=waiting_adapters)


def _names(listed: str) -> list[str]:
    return sorted({name.strip() for name in listed.split(",") if name.strip()})


class EngineLoads:
    """The latest figures of each live engine, read every `interval_s`, and their exposition.

    `engines()` lists the live engines as (model id, URL); `session()` is the event loop's client.
    Also a prometheus_client collector: register it in the worker's registry.
    """

    def __init__(self, engines: Callable[[], Iterable[tuple[str, str]]],
                 session: Callable[[], aiohttp.ClientSession], pod: str,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._engines = engines
        self._session = session
        self.pod = pod
        self.interval_s = interval_s
        self.clock = clock
        self._latest: dict[str, tuple[float, EngineLoad]] = {}  # model -> (when read, figures)

    async def sample(self) -> None:
        """Read every live engine's /metrics once (at once, not one after another). An engine that
        does not answer keeps its last figures, which age (``age_s`` says how old they are); one that
        no longer runs has none."""
        live = list(self._engines())
        answers = await asyncio.gather(*(self._read(model, url) for model, url in live), return_exceptions=True)
        now = self.clock()
        latest: dict[str, tuple[float, EngineLoad]] = {}
        for (model, _), answer in zip(live, answers):
            if isinstance(answer, EngineLoad):
                latest[model] = (now, answer)
                continue
            if isinstance(answer, Exception) and not isinstance(answer, (aiohttp.ClientError, asyncio.TimeoutError,
                                                                          OSError)):
                log.warning("the /metrics of %s's engine did not parse: %s", model, answer)
            if model in self._latest:
                latest[model] = self._latest[model]
        self._latest = latest

    async def _read(self, model: str, url: str) -> EngineLoad | None:
        timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT_S)
        async with self._session().get(url + "/metrics", timeout=timeout) as answer:
            if answer.status != 200:
                return None
            return parse(model, await answer.text())

    async def keep_sampled(self) -> None:
        """Forever: sample, every `interval_s` (the worker's lifespan runs it)."""
        while True:
            try:
                await self.sample()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("reading the engines' metrics failed")
            await asyncio.sleep(self.interval_s)

    def figures(self) -> list[EngineLoad]:
        """Each engine's latest figures, with their age, by model id."""
        now = self.clock()
        return [load.model_copy(update={"age_s": round(now - at, 3)})
                for _, (at, load) in sorted(self._latest.items())]

    # ----- prometheus_client collector ---------------------------------------------------

    def describe(self) -> list[Any]:
        return []  # collected on each scrape, never checked against other collectors' names at registration

    def collect(self) -> Iterable[Any]:
        """The pod as one model server of the Inference Extension's protocol: its engines together."""
        loads = [load for _, load in self._latest.values()]
        waiting = GaugeMetricFamily(names.MODEL_SERVER_WAITING, "Requests the pod's vLLM engines have not started "
                                    "(the Inference Extension's TotalQueuedRequests)", labels=["pod"])
        waiting.add_metric([self.pod], sum(load.waiting for load in loads))
        running = GaugeMetricFamily(names.MODEL_SERVER_RUNNING, "Requests in the running batches of the pod's vLLM "
                                    "engines (TotalRunningRequests)", labels=["pod"])
        running.add_metric([self.pod], sum(load.running for load in loads))
        usage = GaugeMetricFamily(names.MODEL_SERVER_KV_CACHE_USAGE, "KV-cache blocks in use over all blocks of the "
                                  "pod's vLLM engines, 0-1 (KVCacheUtilization)", labels=["pod"])
        usage.add_metric([self.pod], kv_cache_usage(loads))
        lora = GaugeMetricFamily(names.MODEL_SERVER_LORA_INFO, "LoRA adapters resident in the pod's vLLM engines; "
                                 "the value is when they were read (unix seconds)",
                                 labels=["pod", "max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        if any(load.max_lora for load in loads):
            lora.add_metric([self.pod, str(sum(load.max_lora for load in loads)),
                             ",".join(sorted({a for load in loads for a in load.running_lora_adapters})),
                             ",".join(sorted({a for load in loads for a in load.waiting_lora_adapters}))], time.time())
        return [waiting, running, usage, lora]


def kv_cache_usage(loads: list[EngineLoad]) -> float:
    """Blocks in use over all blocks of `loads` (each engine's share weighted by its size, where known)."""
    if not loads:
        return 0.0
    blocks = sum(load.kv_cache_blocks for load in loads)
    if blocks and all(load.kv_cache_blocks for load in loads):
        return sum(load.kv_cache_usage * load.kv_cache_blocks for load in loads) / blocks
    return sum(load.kv_cache_usage for load in loads) / len(loads)
