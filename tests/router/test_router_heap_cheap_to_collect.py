"""What the router keeps per model costs the garbage collector nothing per catalog entry.

A full collection runs on the event loop (on whichever allocation triggers
it) and looks into every tracked container the process holds: with 50 pods
listing 10,000 models each, the map's per-model sets of pods and the
catalog's pydantic entries made each full pass about 8 ms more (38 ms with
the imports), the longest stretch an idle router's loop had. Here the map
and the catalog are filled from reports of many pods listing many models,
and the objects the collector tracks are counted (assertions on counts,
never on time): they follow the copies the pods hold, not pods x catalog
entries. And the command freezes what start-up made (its first map included), so full passes skip it.
"""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.catalog import ModelCatalog
from hotset_router.model_map import ModelMap

PODS = 20
MODELS = 2000
COPIES = 10  # per pod
MiB = 2**20


def tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_catalogs_of_many_pods_add_no_tracked_object_per_entry() -> None:
    names = [f"m{j}" for j in range(MODELS)]
    entries = [CatalogEntry(id=m, framework="torchvision", memory_bytes=MiB, name=m, type="tensor", version="1")
               for m in names]
    reports = [WorkerStatus(pod=f"p{pod}", ready=True, triton_ready=False, memory_budget_bytes=2**32, used_bytes=0,
                            free_bytes=2**32, catalog=entries,
                            models=[ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=MiB)
                                    for m in names[pod::PODS][:COPIES]])
               for pod in range(PODS)]
    before = tracked()
    model_map, catalog = ModelMap(), ModelCatalog()
    for pod, status in enumerate(reports):
        model_map.apply_status(f"http://p{pod}", status)
        catalog.update(status.catalog)
    del reports, entries, status
    added = tracked() - before
    copies = PODS * COPIES
    # A copy is a view and its place in the by-model index; a pod a few objects of its own; and the
    # two top-level indexes. Not a set of pods per model, nor a pydantic entry per model.
    assert added <= 3 * copies + 10 * PODS + 50, f"{added} tracked objects for {copies} copies and {MODELS} models"
    assert len(model_map.pods_with_catalog("m7")) == PODS and catalog.metadata("m7").type == "tensor"
    assert model_map.estimated_bytes("m1999") == MiB and model_map.is_known("m0")


def test_the_router_command_freezes_what_start_up_made_once_the_first_reports_are_read() -> None:
    """The command's settings freeze; its service's start-up (in a process of its own: a freeze in this
    one would keep every later test's garbage) moves its imports and first map out of full passes."""
    from hotset_router import main

    assert main.build_settings(main.parse_args(["--workers", "http://127.0.0.1:9"])).freeze_heap
    probe = textwrap.dedent("""
        import asyncio, gc
        from hotset_router.discovery import StaticDiscovery
        from hotset_router.service import RouterService, RouterSettings

        async def start_and_stop(freeze):
            service = RouterService(StaticDiscovery(["http://127.0.0.1:9"]), RouterSettings(freeze_heap=freeze))
            await service.start()
            frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
            await service.stop()
            return frozen, tracked

        print(*asyncio.run(start_and_stop(False)), *asyncio.run(start_and_stop(True)))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    unfrozen, tracked_before, frozen, still_tracked = map(int, out.stdout.split())
    assert unfrozen == 0 and frozen > 20_000 and still_tracked < tracked_before / 10
