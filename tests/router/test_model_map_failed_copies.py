"""A FAILED copy in a worker's report is neither ready nor loading, and it does not cancel a load the router started.

One class under test (ModelMap), fed WorkerStatus reports as a worker sends them.
"""
from __future__ import annotations

from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.model_map import ModelMap

MiB = 2**20
URL = "http://p1"


def report(*copies: ModelCopy, free: int = 100 * MiB) -> WorkerStatus:
    return WorkerStatus(
        pod="p1", ready=True, triton_ready=False, memory_budget_bytes=100 * MiB, used_bytes=100 * MiB - free,
        free_bytes=free, models=list(copies), catalog=[CatalogEntry(id="m", framework="torchvision", memory_bytes=10 * MiB)],
    )


FAILED = ModelCopy(id="m", framework="torchvision", state=CopyState.FAILED, reason="weights missing", failed_at_s=1.0)


def test_a_failed_copy_is_not_ready_not_loading_and_holds_no_room() -> None:
    model_map = ModelMap()
    model_map.apply_status(URL, report(FAILED))
    assert model_map.ready_copies("m") == [] and model_map.loading_copies("m") == []
    assert model_map.is_known("m") and model_map.free_bytes(URL) == 100 * MiB
    assert model_map.estimated_bytes("m") == 10 * MiB  # the catalog's estimate, not the failed copy's 0


def test_a_stale_failed_report_keeps_the_routers_own_load_reserved() -> None:
    model_map = ModelMap()
    model_map.apply_status(URL, report())
    model_map.reserve_load(URL, "m", 10 * MiB)
    model_map.apply_status(URL, report(FAILED))  # a report from before the retry started
    assert model_map.loading_copies("m") == [URL] and model_map.free_bytes(URL) == 90 * MiB
    loading = ModelCopy(id="m", framework="torchvision", state=CopyState.LOADING, bytes=10 * MiB)
    model_map.apply_status(URL, report(loading, free=90 * MiB))  # the worker now counts it itself
    assert model_map.loading_copies("m") == [URL] and model_map.free_bytes(URL) == 90 * MiB
    model_map.record_loaded(URL, "m", 10 * MiB)
    assert model_map.ready_copies("m") == [URL]
