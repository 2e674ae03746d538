"""Which pods may receive a new copy: dedicated instance groups hold only their own model."""
from __future__ import annotations

from hotset_common import labels
from hotset_common.spec import ModelSpec
from hotset_router.service import RouterService


class PoolsDiscovery:
    """Discovery with pool labels per URL (what KubeDiscovery reads from pod labels)."""

    def __init__(self, pools: dict[str, str], specs: list[ModelSpec]) -> None:
        self.pools = pools
        self._specs = {s.id: s for s in specs}

    def urls(self) -> list[str]:
        return list(self.pools)

    def node_of(self, url: str) -> str:
        return ""

    def pool_of(self, url: str) -> str:
        return self.pools[url]

    def draining(self, url: str) -> bool:
        return False

    def spec_of(self, model: str) -> ModelSpec | None:
        return self._specs.get(model)

    def specs(self) -> list[ModelSpec]:
        return list(self._specs.values())


def spec(model_id: str, placement: str) -> ModelSpec:
    return ModelSpec(id=model_id, framework="transformers", source=f"pvc://models/{model_id}", placement=placement)


def test_shared_models_stay_in_the_shared_pool_and_dedicated_ones_in_their_group():
    discovery = PoolsDiscovery(
        {"http://shared": "shared", "http://big": labels.dedicated_pool("big"), "http://other": labels.dedicated_pool("other"),
         "http://unlabelled": ""},
        [spec("big", "dedicated"), spec("small", "shared")],
    )
    service = RouterService(discovery)  # type: ignore[arg-type]
    allowed = lambda model: sorted(u for u in discovery.urls() if service.eligible(model, u))  # noqa: E731
    assert allowed("big") == ["http://big", "http://unlabelled"]
    assert allowed("small") == ["http://shared", "http://unlabelled"]
    assert allowed("no-spec") == ["http://shared", "http://unlabelled"]


def test_dedicated_models_are_left_to_their_own_pods_by_the_control_loop():
    discovery = PoolsDiscovery({"http://big": labels.dedicated_pool("big")}, [spec("big", "dedicated"), spec("small", "shared")])
    service = RouterService(discovery)  # type: ignore[arg-type]
    assert service.limits_for("big").dedicated
    assert not service.limits_for("small").dedicated and not service.limits_for("no-spec").dedicated


def test_a_dedicated_group_is_never_the_shared_pool_whatever_its_model_is_called():
    """A group dedicated to a model named "shared" (one that got past admission) stays its own."""
    pod_labels = {"hotset.io/pool": "dedicated", "hotset.io/servedmodel": "shared"}
    discovery = PoolsDiscovery({"http://pool": "shared", "http://group": labels.pool_of(pod_labels)},
                               [spec("shared", "dedicated"), spec("small", "shared")])
    service = RouterService(discovery)  # type: ignore[arg-type]
    assert [u for u in discovery.urls() if service.eligible("small", u)] == ["http://pool"]
    assert [u for u in discovery.urls() if service.eligible("shared", u)] == ["http://group"]
