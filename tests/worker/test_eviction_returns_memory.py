"""An evicted model's memory leaves the process: the manager keeps no reference to it."""
from __future__ import annotations

import gc

import psutil

from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


async def test_evicting_a_256mb_model_gives_its_memory_back(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"big": {"size": 256 * MiB, "memory": 256 * MiB}, "small": {"size": MiB, "memory": MiB}})
    manager = ballast.manager(store, budget=256 * MiB)
    try:
        before = rss()
        async with manager.use("big") as worker:
            worker.predict([1])
        del worker
        loaded = rss()
        assert loaded - before > 200 * MiB  # the model really occupies its memory
        await manager.load("small")  # no room for both: big is evicted
        await manager.settled()
        assert manager.loaded_ids() == ["small"]
        assert loaded - rss() > 200 * MiB, f"RSS {before / MiB:.0f} -> {loaded / MiB:.0f} -> {rss() / MiB:.0f} MiB"
    finally:
        await manager.close()
