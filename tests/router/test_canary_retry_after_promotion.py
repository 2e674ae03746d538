"""A request that chose a model's canary and must retry after the canary ended (its first pod
failed while a promotion's reports arrived) retries on the model itself, not on a version no pod
lists any more. Real ModelMap, Targets and Forwarder; the pods are a stand-in `send`."""
from __future__ import annotations

import random
from typing import Mapping

from hotset_common.wire import VARIANT_HEADER, CatalogEntry, CopyState, ModelCopy, WorkerStatus
from hotset_router.deadlines import Deadlines
from hotset_router.forwarding import Forwarder
from hotset_router.model_map import ModelMap
from hotset_router.placement import PlacementSettings
from hotset_router.replication import ModelLimits
from hotset_router.targets import Targets
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import UpstreamResponse

MiB = 2**20


def report(pod: str, copies: list[str], canary: bool) -> WorkerStatus:
    catalog = [CatalogEntry(id="m", framework="torchvision", memory_bytes=MiB,
                            **({"canary": "m_2", "canary_weight": 100} if canary else {}))]
    if canary:
        catalog.append(CatalogEntry(id="m_2", framework="torchvision", memory_bytes=MiB))
    return WorkerStatus(pod=pod, ready=True, triton_ready=True, memory_budget_bytes=64 * MiB, used_bytes=MiB,
                        free_bytes=63 * MiB, catalog=catalog,
                        models=[ModelCopy(id=m, framework="torchvision", state=CopyState.READY, bytes=MiB) for m in copies])


async def test_a_retry_after_the_canary_ended_goes_to_the_model() -> None:
    model_map = ModelMap()
    model_map.apply_status("http://p0", report("p0", ["m_2"], canary=True))
    model_map.apply_status("http://p1", report("p1", ["m"], canary=True))
    metrics = RouterMetrics()
    targets = Targets(model_map, lambda: (lambda m: ModelLimits(0, 1)), lambda: (lambda m, u: True), metrics,
                      PlacementSettings(), random.Random(1), 5)
    forwarder = Forwarder(model_map, lambda: None, None, targets, metrics, Deadlines(5.0), 5)  # type: ignore[arg-type]
    sent: list[tuple[str, str | None]] = []

    async def send(url: str, headers: Mapping[str, str], timeout_s: float) -> UpstreamResponse:
        sent.append((url, headers.get(VARIANT_HEADER)))
        if len(sent) == 1:  # the canary's pod fails while the promotion's reports land
            model_map.apply_status("http://p0", report("p0", [], canary=False))
            model_map.apply_status("http://p1", report("p1", ["m"], canary=False))
            return UpstreamResponse(503, {}, b'{"error": "unloading"}')
        return UpstreamResponse(200, {}, b'{"predictions": 1}')

    answer = await forwarder.forward_with("m", {}, send)
    assert sent == [("http://p0", "m_2"), ("http://p1", None)]
    assert answer.status_code == 200
