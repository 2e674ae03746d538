#!/usr/bin/env python3
"""The router's own work at scale, function by function, this tree beside an older one (CPU time, not wall).

In one process per tree (the older one unpacked from git, first on
PYTHONPATH), a real ``ModelMap`` is filled with ``--pods`` whole reports of
``--models`` catalog entries and ``--copies`` copies each, then timed in
thread CPU time (what the router's event loop itself spends; the figure
does not include waiting for a core on a shared machine):

- **choosing a copy**: the request path's target choice (``ready_copies``
  and the choice between copies), per request, for random models;
- **one control-loop pass** over that map with nothing to do, and its longest
  stretch without a yield to the event loop (the old loop never yields: the
  whole pass);
- **applying a report**: an idle pod's (this tree: a delta; the older one:
  the whole report it reads every second), and one that changed 10 copies;
- **one pass of the status sync** over every pod with nothing changed;
- **a full garbage collection** with that map and the catalog held: it runs
  on the event loop, whichever allocation triggers it, and was an idle
  router's longest stretch (85 ms end to end at this scale). The process
  imports what the command imports and, where the tree does, freezes them
  (hotset_common.heap), then builds the map: the command also freezes the
  map of its first reports, so this is the case of a map built after
  start (pods that came later).

The longest of this tree's stretches (a control-loop step, a page of a
whole state parsed and applied, a full collection) is held to 5 ms, the
issue's "never block the event loop longer": the script exits 1 past it.

These are the costs behind the end-to-end figures of router_scale_models.py,
measured without the load generator and the stand-ins competing for the
same two cores.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from baseline_tree import measure_in, unpack

ROOT = Path(__file__).resolve().parents[1]


def cpu(call: Any, repeat: int = 1) -> float:
    """Thread CPU seconds per call of `call`."""
    started = time.thread_time()
    for _ in range(repeat):
        call()
    return (time.thread_time() - started) / repeat


def measure(pods: int, models: int, copies: int) -> dict[str, Any]:
    """Runs inside the tree under test (its hotset_router first on sys.path)."""
    from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
    from hotset_router import routing
    from hotset_router.discovery import StaticDiscovery
    from hotset_router.model_map import ModelMap
    from hotset_router.replication import ModelLimits, ReplicationPolicy, ReplicationSettings
    from hotset_router.status_sync import StatusSync
    from hotset_router.telemetry import RouterMetrics
    from hotset_router import main as _command  # noqa: F401 - the command's imports, whose objects a collection walks
    try:
        from hotset_common import heap  # this tree: the command freezes its start-up objects before serving
        heap.freeze_start_up()
    except ImportError:  # an older tree: every full collection walks them
        pass

    names = [f"m-{j}" for j in range(models)]
    catalog = [CatalogEntry(id=m, framework="torchvision", memory_bytes=2**23) for m in names]
    delta_capable = "delta" in WorkerStatus.model_fields

    def copy(model: str, used: float = 0.0) -> ModelCopy:
        return ModelCopy(id=model, framework="torchvision", state=CopyState.READY, bytes=2**23, loaded_at_s=100,
                         last_used_s=used, frequency=1.0)

    def whole(pod: int) -> WorkerStatus:
        held = [copy(m) for m in names[pod::pods][:copies]]
        return WorkerStatus(pod=f"p{pod}", ready=True, triton_ready=False, memory_budget_bytes=2**32,
                            used_bytes=len(held) * 2**23, free_bytes=2**32 - len(held) * 2**23, models=held,
                            catalog=catalog)

    reports = {f"http://p{pod}": whole(pod) for pod in range(pods)}
    model_map = ModelMap()
    for url, report in reports.items():
        model_map.apply_status(url, report)
    from hotset_router.catalog import ModelCatalog
    model_catalog = ModelCatalog()
    for report in reports.values():
        model_catalog.update(report.catalog)

    class Client:
        def __init__(self) -> None:
            self.answer: dict[str, WorkerStatus] = reports

        async def status(self, url: str, *args: Any, **kwargs: Any) -> WorkerStatus:
            return self.answer[url]

    client = Client()
    sync = StatusSync(model_map, client, StaticDiscovery(list(reports)), catalog=model_catalog)  # type: ignore[arg-type]
    router = routing.Router(model_map, client, sync, ReplicationPolicy(ReplicationSettings()),  # type: ignore[arg-type]
                            lambda m: ModelLimits(0, 1), RouterMetrics(), rng=random.Random(1))
    rng = random.Random(3)
    picks = [rng.choice(names) for _ in range(2000)]
    iterator = iter(picks * 10)
    target = getattr(router, "targets", router)  # this tree: Router.targets; before: the Router itself
    choose = getattr(target, "target", None) or getattr(target, "_target")
    result: dict[str, Any] = {"choose_copy_ms": 1000 * cpu(lambda: choose(next(iterator), [], True), len(picks))}

    # Control-loop passes: the first (every model), then one with nothing to do; and the longest
    # stretch of each without a yield to the event loop.
    async def timed_pass(subject: Any) -> tuple[float, float]:
        loop = subject.copy_loop
        longest = 0.0
        last = [time.thread_time()]

        async def pause() -> None:
            nonlocal longest
            longest = max(longest, time.thread_time() - last[0])
            await asyncio.sleep(0)
            last[0] = time.thread_time()

        loop.pause = pause
        started = time.thread_time()
        await subject.reconcile_once()
        total = time.thread_time() - started
        return total, max(longest, time.thread_time() - last[0])

    if getattr(router, "copy_loop", None) is None:  # before: every pass is the whole pass, without a yield
        whole_pass = cpu(lambda: asyncio.run(router.reconcile_once()))
        for key in ("idle_pass_ms", "longest_stretch_ms", "first_pass_ms", "first_pass_longest_stretch_ms"):
            result[key] = 1000 * whole_pass
    else:
        first, first_stretch = asyncio.run(timed_pass(router))
        idle_pass, stretch = asyncio.run(timed_pass(router))
        result.update(first_pass_ms=1000 * first, first_pass_longest_stretch_ms=1000 * first_stretch,
                      idle_pass_ms=1000 * idle_pass, longest_stretch_ms=1000 * stretch)

    # What applying one pod's report costs: idle, and with 10 copies changed.
    url = "http://p0"
    if delta_capable:
        idle = reports[url].model_copy(update={"models": [], "catalog": [], "delta": True, "cursor": "e.1"})
        busy = idle.model_copy(update={"models": [copy(m, used=0.5) for m in names[0::pods][:10]]})
        from hotset_router.status_sync import DEFAULT_PAGE  # a page of a whole state, as the sync asks for it
        whole_page = reports[url].model_copy(update={"models": reports[url].models[:50],
                                                     "catalog": catalog[:DEFAULT_PAGE - 50], "delta": True,
                                                     "cursor": "e.2"})
        result["page_apply_ms"] = 1000 * cpu(lambda: model_map.apply_status(url, whole_page), 20)
        page_body = whole_page.model_dump_json()
        result["page_parse_ms"] = 1000 * cpu(lambda: WorkerStatus.model_validate_json(page_body), 10)
        result["page_entries"] = DEFAULT_PAGE
    else:
        idle = busy = reports[url]
    result["idle_report_apply_ms"] = 1000 * cpu(lambda: model_map.apply_status(url, idle), 20)
    result["changed_report_apply_ms"] = 1000 * cpu(lambda: model_map.apply_status(url, busy), 20)
    body = idle.model_dump_json()
    result["idle_report_bytes"] = len(body)
    result["idle_report_parse_ms"] = 1000 * cpu(lambda: WorkerStatus.model_validate_json(body), 10)

    # One status pass over every pod, nothing changed (the answers are already parsed: apply only).
    if delta_capable:
        client.answer = {u: r.model_copy(update={"models": [], "catalog": [], "delta": True, "cursor": "e.1"})
                         for u, r in reports.items()}
    result["status_pass_ms"] = 1000 * cpu(lambda: asyncio.run(sync.refresh_all()), 3)

    # A full collection with the router's state held, and no longer the benchmark's own reports (a
    # router keeps none): the best of three (the first also frees the set-up's garbage).
    import gc
    client.answer = {}
    reports = report = catalog = idle = busy = picks = iterator = None  # noqa: F841
    if delta_capable:
        whole_page = None  # noqa: F841
    result["full_collection_ms"] = 1000 * min(cpu(lambda: gc.collect(2)) for _ in range(3))
    result["tracked_objects"] = len(gc.get_objects())
    return result


PACKAGES = ("common", "router")


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    return measure_in(tree, PACKAGES, __file__, "--pods", str(args.pods), "--models", str(args.models),
                      "--copies", str(args.copies))


ROWS = [
    ("choose a copy, per request (ms)", "choose_copy_ms"),
    ("control-loop pass, nothing to do (ms)", "idle_pass_ms"),
    ("  its longest stretch without a yield (ms)", "longest_stretch_ms"),
    ("first control-loop pass, every model (ms)", "first_pass_ms"),
    ("  its longest stretch without a yield (ms)", "first_pass_longest_stretch_ms"),
    ("apply an idle pod's report (ms)", "idle_report_apply_ms"),
    ("  parse it (ms)", "idle_report_parse_ms"),
    ("  its size (bytes)", "idle_report_bytes"),
    ("apply a report with 10 copies changed (ms)", "changed_report_apply_ms"),
    ("apply a page of a whole state (ms)", "page_apply_ms"),
    ("  parse it (ms)", "page_parse_ms"),
    ("  its entries", "page_entries"),
    ("status pass over every pod, nothing changed (ms)", "status_pass_ms"),
    ("a full garbage collection, all of it held (ms)", "full_collection_ms"),
    ("  objects it looks into", "tracked_objects"),
]
STRETCH_LIMIT_MS = 5.0  # never block the event loop longer (issue 17)


def longest_stretch(result: dict[str, Any]) -> tuple[float, str]:
    """The longest stretch without a yield among the measured ones, and what it was."""
    stretches = {"a control-loop step": max(result["longest_stretch_ms"], result["first_pass_longest_stretch_ms"]),
                 "a page of a whole state, parsed and applied": result.get("page_apply_ms", 0.0)
                 + result.get("page_parse_ms", 0.0),
                 "a full garbage collection": result["full_collection_ms"]}
    what = max(stretches, key=lambda k: stretches[k])
    return stretches[what], what


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--copies", type=int, default=200, help="copies per pod")
    parser.add_argument("--baseline", default="", help="the older tree to measure beside this one ('': none; "
                        "docs/benchmarks.md's was d516879, see baseline_tree.py)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(measure(args.pods, args.models, args.copies)))
        return 0
    with tempfile.TemporaryDirectory(prefix="router-functions-") as tmp:
        trees = [("this tree", ROOT)] + ([(args.baseline, unpack(args.baseline, Path(tmp), *PACKAGES))] if args.baseline else [])
        results = {label: run_tree(tree, args) for label, tree in trees}
    print(f"router functions at scale: {args.pods} pods x {args.models} models, {args.copies} copies per pod "
          f"(thread CPU time; load average {os.getloadavg()[0]:.1f})")
    labels = list(results)
    print(f"{'':<50}" + "".join(f"{label:>14}" for label in labels) + ("      ratio" if len(labels) == 2 else ""))
    for name, key in ROWS:
        cells = [results[label].get(key) for label in labels]
        text = "".join(f"{c:>14.3f}" if isinstance(c, float) else f"{c if c is not None else '-':>14}" for c in cells)
        ratio = ""
        if len(cells) == 2 and all(isinstance(c, (int, float)) and c for c in cells):
            ratio = f"  {cells[1] / cells[0]:>8.0f}x"
        print(f"{name:<50}{text}{ratio}")
    print(json.dumps(results))
    longest, what = longest_stretch(results["this tree"])
    verdict = "met" if longest <= STRETCH_LIMIT_MS else "NOT met"
    print(f"this tree's longest stretch without a yield: {longest:.2f} ms ({what}); "
          f"target <= {STRETCH_LIMIT_MS:.0f} ms: {verdict}")
    return 0 if longest <= STRETCH_LIMIT_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
