"""The status sync reads a pod's whole state once, in pages of bounded size, then only what changed;
a pod that left the map, or restarted, is read whole again (the workers' own report builder, behind
stand-in pods)."""
from __future__ import annotations

from hotset_common import wire
from hotset_router.discovery import StaticDiscovery
from hotset_router.model_map import ModelMap
from hotset_router.status_sync import StatusSync
from hotset_testing.standin_pods import Standins, StandinPod

MiB = 2**20


class ReportsClient:
    """Asks the stand-in pods' report builders directly, and remembers every answer."""

    def __init__(self, pods: dict[str, StandinPod]) -> None:
        self.pods = pods
        self.answers: list[tuple[str, wire.WorkerStatus]] = []

    async def status(self, url: str, since: str | None = None, limit: int | None = None) -> wire.WorkerStatus:
        report = self.pods[url].reports.report({"ready": True, "triton_ready": False}, since, limit, "router-1")
        self.answers.append((url, report))
        return report


def entries(report: wire.WorkerStatus) -> int:
    return len(report.models) + len(report.catalog) + len(report.removed_models) + len(report.removed_catalog)


async def test_first_contact_in_pages_then_only_changes():
    standins = Standins(pods=2, models=1200, copies_per_pod=10, model_bytes=MiB, budget=4096 * MiB)
    pods = {f"http://{pod.name}": pod for pod in standins.pods}
    client = ReportsClient(pods)
    model_map = ModelMap()
    sync = StatusSync(model_map, client, StaticDiscovery(list(pods)), page=250)  # type: ignore[arg-type]

    await sync.refresh_all()
    assert max(entries(r) for _, r in client.answers) <= 250
    assert [url for url, _ in client.answers].count("http://standin-0") == 5  # 1,210 entries, 250 at a time
    assert len(model_map.known_models()) == 1200
    assert sorted(model_map.pod("http://standin-1").copies) == sorted(pods["http://standin-1"].copies)

    client.answers.clear()
    await sync.refresh_all()
    assert len(client.answers) == 2 and all(entries(r) == 0 and r.delta for _, r in client.answers)

    pods["http://standin-0"].load("m-1")
    pods["http://standin-1"].unload("m-1")
    client.answers.clear()
    await sync.refresh_all()
    assert sum(entries(r) for _, r in client.answers) == 2
    assert model_map.ready_copies("m-1") == ["http://standin-0"]

    model_map.remove_pod("http://standin-1")  # it stopped answering a request for a moment
    client.answers.clear()
    await sync.refresh_all()
    assert [url for url, _ in client.answers].count("http://standin-1") == 5  # read whole again
    assert len(model_map.pod("http://standin-1").catalog) == 1200
