"""Evicting a model runs no full garbage collection on the request path (it paused every request
for ~200 ms); memory held by a reference cycle is still collected, later and on another thread."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest

from hotset_common.spec import ModelSpec
from hotset_worker import memory
from hotset_worker.frameworks.base import WorkerContext
from hotset_worker.manager import ModelManager
from hotset_worker.store import MemoryModelStore


@pytest.fixture
def full_collections(monkeypatch) -> list[str]:
    """The threads on which code called gc.collect() while the test ran (the interpreter's own
    automatic collections are not the code's doing, and skip the frozen import-time objects)."""
    seen: list[str] = []
    collect = gc.collect

    def recording(*args, **kwargs) -> int:
        seen.append(threading.current_thread().name)
        return collect(*args, **kwargs)

    monkeypatch.setattr(gc, "collect", recording)
    return seen


async def test_evicting_a_real_transformers_model_runs_no_full_collection(
        sample_specs: dict[str, ModelSpec], full_collections: list[str]) -> None:
    store = MemoryModelStore([sample_specs["sentiment"], sample_specs["mini-embed"]])
    manager = ModelManager(store, WorkerContext(), 2**30, max_models=1, admission_control=False)
    try:
        async with manager.use("sentiment") as worker:
            worker.predict("warm")  # imports done, framework prepared (and its objects frozen)
        full_collections.clear()
        await manager.load("mini-embed")  # sentiment is evicted and unloaded
        await manager.settled()
        assert manager.loaded_ids() == ["mini-embed"]
        assert full_collections == []
    finally:
        await manager.close()


class _Cyclic:
    def __init__(self) -> None:
        self.me = self
        self.payload = bytearray(2**20)


def test_an_object_held_by_a_cycle_is_collected_later_on_another_thread(monkeypatch, full_collections) -> None:
    monkeypatch.setattr(memory, "_collector", memory._DeferredCollector(interval_s=0.05))
    cyclic = _Cyclic()
    dropped = weakref.ref(cyclic)
    del cyclic
    memory.release([dropped])  # still alive: only a cycle holds it
    assert dropped() is not None and "MainThread" not in full_collections
    for _ in range(200):
        if dropped() is None:
            break
        threading.Event().wait(0.01)
    assert dropped() is None
    assert full_collections and "MainThread" not in full_collections
