"""A promotion can land between a request's lookup of its canary version and its admission: the
model then answers, never a 404 (it was one, in the gateway's canary test, at the moment of a
promotion). Real manager and data plane, ballast models; the store is a stand-in that promotes the
canary the moment a request has resolved it."""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_testing import ballast_framework as ballast
from hotset_testing.ballast_framework import MiB
from hotset_worker.backends import Backends
from hotset_worker.dataplane import DataPlane
from hotset_worker.metrics import WorkerMetrics
from hotset_worker.store import MemoryModelStore


class PromotedOnceResolved(MemoryModelStore):
    """A store whose canary `m_2` is promoted (version 2 becomes `m`'s own, `m_2` leaves) right
    after a request's first lookup of `m_2` returns it: the worst moment for a store update."""

    def __init__(self, promoted: ModelSpec, *specs: ModelSpec) -> None:
        super().__init__(specs)
        self.promoted = promoted
        self.armed = False

    def get(self, model_id: str) -> ModelSpec:
        spec = super().get(model_id)
        if self.armed and model_id == "m_2":
            self.armed = False
            self.put(self.promoted)
        return spec


async def test_a_canary_promoted_between_resolve_and_admission_is_answered_by_the_model(tmp_path) -> None:
    v1 = ballast.write_model(tmp_path / "v1", MiB, factor=2.0)
    v2 = ballast.write_model(tmp_path / "v2", MiB, factor=3.0)
    canary = {"canary": {"version": "2", "source": f"file://{v2}", "weight": 100}}
    before = ballast.make_spec("m", v1, memory=MiB, version="1", rollout=canary)
    after = ballast.make_spec("m", v2, memory=MiB, version="2")
    store = PromotedOnceResolved(after, before)
    manager = ballast.manager(store, budget=8 * MiB)
    dataplane = DataPlane(manager, WorkerMetrics("pod", 8 * MiB), Backends())
    try:
        await manager.load("m_2")  # the canary's copy is ready: the request finds it, then its spec is gone
        store.armed = True
        answer = await dataplane.predict("m", [1], variant="m_2")
        assert not store.armed, "the stand-in never promoted: the test did not exercise the window"
        assert "m_2" not in store.ids()
        assert answer["scaled"] == [3.0]  # version 2, now the model's own
    finally:
        dataplane.close()
        await manager.close()
