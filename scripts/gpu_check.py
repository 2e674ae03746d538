#!/usr/bin/env python3
"""One short check of the worker on a CUDA GPU, through the real model manager (issue 18).

    .venv/bin/python scripts/gpu_check.py                  # on a CUDA machine: under 7 minutes
    .venv/bin/python scripts/gpu_check.py --device cpu     # a dry run of the same code paths on the CPU

It loads the in-process sample models (``hotset-samples --out build/models``: the sentiment
classifiers, the mini-embed encoder, the colors image classifier, the tiny-chat causal LM) through
``ModelManager`` twice, once on the CPU and once on the device, and then:

1. **predictions**: compares every number the device predicts with the CPU's (within 1e-3);
2. **sizes**: each copy's measured size (what the budget counts) against what the allocator saw
   its load take (``memory_allocated`` after minus before) and its peak (``max_memory_allocated``),
   and the activation peak of one predict batch on top of the weights;
3. **cycles**: 20 load/evict cycles of three models under a budget that holds two, then everything
   unloaded: allocated and reserved memory must be back at the baseline (within 64 MB);
4. **rollout**: the peak while a copy rolls to a new version (old and new side by side), against
   the budget, with room for both and with room for one;
5. **streaming**: tiny-chat generating on the device, token by token: time to first token and time
   per output token (median of three).

It writes one JSON file (``--out``, default ``build/gpu-check.json``) and exits 1 if a check
failed. Where CUDA is not available (and ``--device cpu`` was not asked for) it says so, writes a
JSON file saying so, and exits 0. With ``--device cpu`` the allocator figures are the process's
resident memory instead and only the predictions are asserted (CPU against CPU): the point is that
every path of the real run works, so that it is ready for a GPU machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "build" / "models" / "model-store.json"
OUT = ROOT / "build" / "gpu-check.json"
MiB = 2**20
TOLERANCE = 1e-3  # largest difference between a device prediction and the CPU's
BASELINE_SLACK = 64 * MiB  # allocated and reserved memory back within this of the baseline
TEXTS = ["what a wonderful and great day", "this is terrible and awful"]
CHAT = [{"role": "user", "content": "what color is the sky?"}]
# The in-process sample models (triton and vllm models need a sidecar or an engine process).
MODELS = ("sentiment", "sentiment-v2", "mini-embed", "colors", "tiny-chat")
CYCLE_MODELS = ("sentiment", "mini-embed", "colors")


def sample_input(model: str) -> Any:
    if model.startswith("colors"):
        import base64
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (32, 32), (230, 20, 20)).save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode()
    if model == "tiny-chat":
        return "what color is the sky?"
    return TEXTS


def numbers(value: Any) -> Iterator[float]:
    """Every number in a JSON-like prediction, in a fixed order."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from numbers(value[key])
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from numbers(item)


def texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in texts(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in texts(item)]
    return []


class Memory:
    """The device's allocator figures (CUDA), or the process's resident memory (the CPU dry run)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        if self.cuda:
            import torch

            self.torch = torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def allocated(self) -> int:
        self.sync()
        if self.cuda:
            return int(self.torch.cuda.memory_allocated())
        import psutil

        return psutil.Process().memory_info().rss

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved()) if self.cuda else self.allocated()

    def reset_peak(self) -> None:
        self.sync()
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        self.sync()
        return int(self.torch.cuda.max_memory_allocated()) if self.cuda else None

    def empty(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()


@dataclass
class Report:
    """The JSON file: one section per step, and every failed check by name."""

    started: float = field(default_factory=time.monotonic)
    sections: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
            print(f"  FAILED: {what}", flush=True)
        return ok

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def build_manager(specs: list[Any], device: str, budget: int, **options: Any) -> Any:
    """The real ModelManager over an in-memory store of `specs`, loading on `device`."""
    from hotset_common.eviction import EvictionPolicy
    from hotset_worker.frameworks.base import WorkerContext
    from hotset_worker.manager import ModelManager
    from hotset_worker.store import MemoryModelStore

    options.setdefault("policy", EvictionPolicy(churn_guard_s=0))
    return ModelManager(MemoryModelStore(specs), WorkerContext(device=device), budget, **options)


async def predict(manager: Any, model: str, data: Any) -> Any:
    async with manager.use(model) as worker:
        return await asyncio.to_thread(worker.predict, data)


def size_of(manager: Any, model: str) -> int:
    return next(view.bytes for view in manager.snapshot() if view.model_id == model)


async def check_predictions_and_sizes(specs: dict[str, Any], device: str, memory: Memory, report: Report) -> dict[str, int]:
    """Steps 1 and 2; returns each model's measured size on the device."""
    big = 64 * 2**30
    cpu = build_manager(list(specs.values()), "cpu", big)
    dev = build_manager(list(specs.values()), device, big)
    section: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    try:
        for model in specs:
            data = sample_input(model)
            expected = await predict(cpu, model, data)
            await cpu.unload(model)
            memory.reset_peak()
            before = memory.allocated()
            started = time.perf_counter()
            await dev.load(model)
            load_s = time.perf_counter() - started
            after, load_peak = memory.allocated(), memory.peak()
            measured = sizes[model] = size_of(dev, model)
            memory.reset_peak()
            resting = memory.allocated()
            got = await predict(dev, model, data)
            batch_peak = memory.peak()
            want, have = list(numbers(expected)), list(numbers(got))
            worst = max((abs(a - b) for a, b in zip(want, have)), default=0.0)
            entry = {
                "load_s": round(load_s, 3), "measured_bytes": measured, "allocator_delta_bytes": after - before,
                "load_peak_delta_bytes": None if load_peak is None else load_peak - before,
                "batch_activation_peak_bytes": None if batch_peak is None else batch_peak - resting,
                "numbers_compared": len(want), "max_abs_difference": worst,
                "same_text": texts(expected) == texts(got),
            }
            if measured:
                entry["allocator_delta_over_measured"] = round((after - before) / measured, 3)
            section[model] = entry
            print(f"  {model}: measured {measured / MiB:.1f} MiB, allocator +{(after - before) / MiB:.1f} MiB, "
                  f"max |device - cpu| {worst:.2e} over {len(want)} numbers", flush=True)
            report.check(len(want) == len(have), f"{model}: the device answered {len(have)} numbers, the CPU {len(want)}")
            report.check(worst <= TOLERANCE, f"{model}: device and CPU differ by {worst:.2e} (> {TOLERANCE})")
            if memory.cuda and measured >= 4 * MiB:  # below, the allocator's 512-byte blocks dominate
                # The budget counts the measured size: what the allocator holds for the copy must not be
                # far above it (the size would understate the copy), nor far below (overstate it).
                report.check(0.5 <= (after - before) / measured <= 2.0,
                             f"{model}: the allocator holds {(after - before) / MiB:.1f} MiB for a copy measured at "
                             f"{measured / MiB:.1f} MiB")
        for model in specs:
            await dev.unload(model)
    finally:
        await cpu.close()
        await dev.close()
    report.sections["models"] = section
    return sizes


async def check_cycles(specs: dict[str, Any], device: str, memory: Memory, sizes: dict[str, int],
                       cycles: int, report: Report) -> None:
    """Step 3: load/evict cycles under a two-model budget (each asks for the model not loaded, which
    evicts one of the two that are), then everything unloaded: memory back at the baseline."""
    chosen = [specs[m] for m in CYCLE_MODELS if m in specs]
    measured = sorted((sizes[s.id] for s in chosen), reverse=True)
    budget = measured[0] + measured[1] + measured[2] // 2  # the two largest fit, never all three
    memory.empty()
    baseline = (memory.allocated(), memory.reserved())
    manager = build_manager([s.model_copy(update={"memory_bytes": sizes[s.id]}) for s in chosen], device, budget,
                            admission_control=False)
    highest = 0
    rows = []
    ids = [spec.id for spec in chosen]
    try:
        for model in ids[:2]:  # the budget full
            await predict(manager, model, sample_input(model))
        for cycle in range(cycles):  # each cycle: a model not loaded now is asked for, and one is evicted
            before = set(manager.loaded_ids())
            model = next(m for m in ids[cycle % len(ids):] + ids if m not in before)
            await predict(manager, model, sample_input(model))
            await manager.settled()
            held = memory.allocated() - baseline[0]
            highest = max(highest, held)
            rows.append({"cycle": cycle, "model": model, "loaded": manager.loaded_ids(), "evicted": sorted(before - set(manager.loaded_ids())),
                         "held_bytes": held, "budget_used_bytes": manager.used_bytes()})
        evictions = sum(len(row["evicted"]) for row in rows)
    finally:
        await manager.close()
    memory.empty()
    after = (memory.allocated(), memory.reserved())
    section = {"budget_bytes": budget, "cycles": cycles, "evictions": evictions, "highest_held_bytes": highest,
               "baseline": {"allocated": baseline[0], "reserved": baseline[1]},
               "after": {"allocated": after[0], "reserved": after[1]}, "rows": rows}
    report.sections["cycles"] = section
    print(f"  {cycles} cycles, {evictions} evictions under {budget / MiB:.1f} MiB; allocated "
          f"{(after[0] - baseline[0]) / MiB:+.1f} MiB, reserved {(after[1] - baseline[1]) / MiB:+.1f} MiB", flush=True)
    report.check(evictions == cycles, f"{evictions} evictions in {cycles} cycles of three models under a two-model budget")
    if memory.cuda:
        report.check(abs(after[0] - baseline[0]) <= BASELINE_SLACK,
                     f"allocated memory {(after[0] - baseline[0]) / MiB:+.1f} MiB from its baseline after the cycles")
        report.check(abs(after[1] - baseline[1]) <= BASELINE_SLACK,
                     f"reserved memory {(after[1] - baseline[1]) / MiB:+.1f} MiB from its baseline after the cycles")


async def rollout_peak(specs: dict[str, Any], device: str, memory: Memory, sizes: dict[str, int], room: float) -> dict[str, Any]:
    """One rollout of sentiment from version 1 to version 2 (sentiment-v2's weights) under a budget of
    `room` x its size: the peak above the baseline while it rolls, and where it ended."""
    old = specs["sentiment"].model_copy(update={"memory_bytes": sizes["sentiment"]})
    new = old.model_copy(update={"version": "2", "source": specs["sentiment-v2"].source})
    budget = int(sizes["sentiment"] * room)
    memory.empty()
    baseline = memory.allocated()
    manager = build_manager([old], device, budget)
    try:
        await predict(manager, "sentiment", TEXTS)
        memory.reset_peak()
        manager.store.put(new)
        started = manager.roll_stale_copies()
        await manager.settled()
        answer = await predict(manager, "sentiment", TEXTS)  # a request after the roll: the version serving now
        await manager.settled()
        peak = memory.peak()
        version = next(v.version for v in manager.snapshot() if v.model_id == "sentiment")
    finally:
        await manager.close()
    held = None if peak is None else peak - baseline
    return {"budget_bytes": budget, "rollout_started": bool(started), "version_after": version,
            "peak_held_bytes": held, "peak_over_budget": None if held is None else held > budget,
            "answered": bool(answer)}


async def check_rollouts(specs: dict[str, Any], device: str, memory: Memory, sizes: dict[str, int], report: Report) -> None:
    """Step 4. The budget is hard: with room for both versions the rollout finishes; with room for
    one it does not start (the old version serves) and nothing goes over. The peaks are recorded
    (weights are what is counted; the activation peak is the figure to compare)."""
    section = {"room_for_both": await rollout_peak(specs, device, memory, sizes, 2.5),
               "room_for_one": await rollout_peak(specs, device, memory, sizes, 1.3)}
    report.sections["rollout"] = section
    for name, row in section.items():
        held = "n/a" if row["peak_held_bytes"] is None else f"{row['peak_held_bytes'] / MiB:.1f} MiB"
        print(f"  {name}: started {row['rollout_started']}, now version {row['version_after']}, peak {held} "
              f"against a budget of {row['budget_bytes'] / MiB:.1f} MiB", flush=True)
    report.check(section["room_for_both"]["version_after"] == "2", "the rollout with room for both did not finish")
    report.check(not section["room_for_one"]["rollout_started"] and section["room_for_one"]["version_after"] == "1",
                 "a rollout without room for both versions started")


class _Clock:
    """The TokenSink of one generation: when each piece of text left the generating thread."""

    def __init__(self) -> None:
        self.begun = time.perf_counter()
        self.stamps: list[float] = []
        self.parts: list[str] = []

    def started(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens

    def text(self, delta: str) -> None:
        self.stamps.append(time.perf_counter())
        self.parts.append(delta)

    def tokens(self, count: int) -> None:
        pass

    def cancelled(self) -> bool:
        return False


async def check_streaming(specs: dict[str, Any], device: str, report: Report) -> None:
    """Step 5: tiny-chat on the device, greedy, three times: time to first token, time per token."""
    from hotset_worker.generation import GenerationRequest

    manager = build_manager([specs["tiny-chat"]], device, 8 * 2**30)
    runs = []
    try:
        for _ in range(3):
            async with manager.use("tiny-chat") as worker:
                clock = _Clock()
                result = await asyncio.to_thread(worker.generate, GenerationRequest(messages=CHAT, max_tokens=32,
                                                                                    temperature=0.0), clock)
            first = clock.stamps[0] - clock.begun if clock.stamps else math.nan
            per_token = ((clock.stamps[-1] - clock.stamps[0]) / (len(clock.stamps) - 1)
                         if len(clock.stamps) > 1 else math.nan)
            runs.append({"ttft_s": first, "time_per_token_s": per_token, "tokens": result.completion_tokens,
                         "text": "".join(clock.parts)})
    finally:
        await manager.close()
    section = {"runs": runs, "ttft_s_median": statistics.median(r["ttft_s"] for r in runs),
               "time_per_token_s_median": statistics.median(r["time_per_token_s"] for r in runs)}
    report.sections["streaming"] = section
    print(f"  tiny-chat: TTFT {section['ttft_s_median'] * 1000:.1f} ms, "
          f"{section['time_per_token_s_median'] * 1000:.2f} ms per token, {runs[0]['text']!r}", flush=True)
    report.check(all(r["tokens"] > 0 for r in runs), "tiny-chat generated nothing")


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
                            "cuda_available": torch.cuda.is_available(), "host": platform.node()}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, gpu_memory_bytes=int(properties.total_memory),
                    cuda=torch.version.cuda, capability=f"{properties.major}.{properties.minor}")
        from hotset_worker import memory

        info["default_model_budget_bytes"] = memory.gpu_model_budget(int(properties.total_memory), None)[0]
    return info


async def run(args: argparse.Namespace, report: Report) -> None:
    from hotset_worker.store import JsonModelStore

    store = JsonModelStore(args.models)
    known = {spec.id: spec for spec in store.list()}
    missing = [m for m in MODELS if m not in known]
    if missing:
        raise SystemExit(f"gpu_check: {args.models} lacks {', '.join(missing)}; run `.venv/bin/hotset-samples --out build/models`")
    specs = {m: known[m] for m in MODELS}
    memory = Memory(args.device)
    print("1-2. predictions against the CPU, and sizes", flush=True)
    sizes = await check_predictions_and_sizes(specs, args.device, memory, report)
    later: list[tuple[str, Callable[[], Any]]] = [
        ("3. load/evict cycles under a two-model budget", lambda: check_cycles(specs, args.device, memory, sizes, args.cycles, report)),
        ("4. the peak during a rollout", lambda: check_rollouts(specs, args.device, memory, sizes, report)),
        ("5. streaming tiny-chat", lambda: check_streaming(specs, args.device, report)),
    ]
    for title, step in later:
        if report.elapsed() > args.time_limit_s:
            report.sections.setdefault("skipped", []).append(title)
            report.check(False, f"{title}: skipped, past the time limit of {args.time_limit_s:.0f} s")
            continue
        print(title, flush=True)
        await step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (the check), or cpu: a dry run of the same code paths")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON file written")
    parser.add_argument("--models", type=Path, default=STORE, help="the sample models' store (hotset-samples)")
    parser.add_argument("--cycles", type=int, default=20, help="load/evict cycles under the two-model budget")
    parser.add_argument("--time-limit-s", type=float, default=360.0,
                        help="steps not started by then are skipped (and fail the check)")
    args = parser.parse_args(argv)
    for path in ("common", "worker-image"):
        sys.path.insert(0, str(ROOT / path))
    import torch

    report = Report()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA device here (torch.cuda.is_available() is False): nothing checked; run it on a GPU machine"
        print(f"gpu_check: {reason}")
        args.out.write_text(json.dumps({"environment": environment("cpu"), "skipped": reason}, indent=1))
        return 0
    report.sections["environment"] = environment(args.device)
    print(f"gpu_check on {report.sections['environment'].get('gpu', 'the CPU (dry run)')}", flush=True)
    try:
        asyncio.run(run(args, report))
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the JSON must say what broke
        report.check(False, f"the check itself failed: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    report.sections["seconds"] = round(report.elapsed(), 1)
    report.sections["failures"] = report.failures
    args.out.write_text(json.dumps(report.sections, indent=1, default=str))
    print(f"gpu_check: {'ok' if not report.failures else f'{len(report.failures)} failed'} in "
          f"{report.elapsed():.0f} s; wrote {args.out}", flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
