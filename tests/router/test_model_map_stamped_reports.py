"""A report asked for before the router learned something newer does not undo it.

One class under test (ModelMap) with an injected clock, fed WorkerStatus
reports stamped with when they were asked for, as StatusSync sends them.
"""
from __future__ import annotations

from hotset_common.wire import CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.model_map import ModelMap

MiB = 2**20
URL = "http://p1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report(*ready: str, free: int = 100 * MiB, loading: tuple[str, ...] = ()) -> WorkerStatus:
    copies = [ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=10 * MiB) for m in ready]
    copies += [ModelCopy(id=m, framework="torchvision", state=CopyState.LOADING, bytes=10 * MiB) for m in loading]
    return WorkerStatus(pod="p1", ready=True, triton_ready=False, memory_budget_bytes=100 * MiB,
                        used_bytes=100 * MiB - free, free_bytes=free, models=copies,
                        catalog=[CatalogEntry(id=m, framework="torchvision", memory_bytes=10 * MiB) for m in "abc"])


def stamped_map() -> tuple[ModelMap, Clock]:
    clock = Clock()
    model_map = ModelMap(clock=clock)
    model_map.apply_status(URL, report())
    return model_map, clock


def test_a_report_asked_before_a_load_finished_keeps_the_new_copy():
    model_map, clock = stamped_map()
    asked = model_map.now()  # the status request leaves while the load still runs
    clock.now += 1
    model_map.record_loaded(URL, "a", 10 * MiB)
    clock.now += 1
    model_map.apply_status(URL, report(loading=("a",), free=90 * MiB), asked_at=asked)  # ...and lands after it
    assert model_map.ready_copies("a") == [URL]
    assert model_map.free_bytes(URL) == 90 * MiB  # counted once, not twice


def test_a_report_asked_after_the_load_is_the_truth():
    model_map, clock = stamped_map()
    model_map.record_loaded(URL, "a", 10 * MiB)
    clock.now += 1
    model_map.apply_status(URL, report(), asked_at=model_map.now())  # the worker evicted it since
    assert model_map.ready_copies("a") == []
    assert model_map.free_bytes(URL) == 100 * MiB


def test_an_unload_is_not_undone_by_an_older_report():
    model_map, clock = stamped_map()
    model_map.apply_status(URL, report("a", free=90 * MiB))
    asked = model_map.now()
    clock.now += 1
    model_map.record_unloaded(URL, "a")
    model_map.apply_status(URL, report("a", free=90 * MiB), asked_at=asked)
    assert model_map.ready_copies("a") == [] and model_map.free_bytes(URL) == 100 * MiB
    clock.now += 1
    model_map.apply_status(URL, report("a", free=90 * MiB), asked_at=model_map.now())  # loaded again since
    assert model_map.ready_copies("a") == [URL]


def test_a_failed_copy_is_skipped_until_a_report_asked_after_the_failure():
    model_map, clock = stamped_map()
    model_map.apply_status(URL, report("a", free=90 * MiB))
    asked = model_map.now()
    clock.now += 1
    model_map.mark_copy_failed(URL, "a")
    model_map.apply_status(URL, report("a", free=90 * MiB), asked_at=asked)
    assert model_map.ready_copies("a") == []
    clock.now += 1
    model_map.apply_status(URL, report("a", free=90 * MiB), asked_at=model_map.now())
    assert model_map.ready_copies("a") == [URL]


def test_copies_on_a_draining_pod_serve_only_when_there_is_no_other():
    model_map, _ = stamped_map()
    model_map.apply_status(URL, report("a", "b", free=80 * MiB), draining=True)
    model_map.apply_status("http://p2", report("a", free=90 * MiB))
    assert model_map.ready_copies("a") == ["http://p2"]
    assert model_map.ready_copies("b") == [URL]
