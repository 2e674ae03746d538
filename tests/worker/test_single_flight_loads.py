"""However many requests wait for a cold model, it loads once."""
from __future__ import annotations

import asyncio

import pytest

from hotset_common import errors
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB



async def test_twenty_concurrent_requests_for_a_cold_model_cause_one_load(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"cold": {"size": MiB, "delay": 0.3}})
    manager = ballast.manager(store, budget=10 * MiB)

    async def request(i: int):
        async with manager.use("cold") as worker:
            return worker.predict([i])

    try:
        results = await asyncio.gather(*(request(i) for i in range(20)))
        assert ballast.ATTEMPTS["cold"] == 1
        assert [r["scaled"] for r in results] == [[2.0 * i] for i in range(20)]
    finally:
        await manager.close()


async def test_twenty_concurrent_requests_for_a_broken_model_share_one_failed_load(tmp_path) -> None:
    store = ballast.catalog(tmp_path, {"broken": {"corrupt": True}})
    manager = ballast.manager(store, budget=10 * MiB, failure_backoff_s=0)
    try:
        results = await asyncio.gather(*(manager.load("broken") for _ in range(20)), return_exceptions=True)
        assert ballast.ATTEMPTS["broken"] == 1
        assert all(isinstance(r, errors.ModelLoadFailed) and "corrupt" in r.message for r in results)
        with pytest.raises(errors.ModelLoadFailed):  # with no back-off, the next request tries again
            await manager.load("broken")
        assert ballast.ATTEMPTS["broken"] == 2
    finally:
        await manager.close()
