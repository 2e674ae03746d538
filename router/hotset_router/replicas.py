"""Which router replica acts for a model in the background, chosen alike by every replica.

Every replica sees the same demand (the workers' reports; replication.py)
and so reaches the same decision; if each carried it out, R replicas would
add R copies. So for each model one replica acts: the highest rendezvous
hash of (model, replica id) among the replicas the workers heard from
lately (each status request names its router, ``wire.ROUTER_ID_HEADER``,
and each report lists the routers its worker heard from within the last
10 s, ``WorkerStatus.routers``), this replica always among them. No
leader, no API server, no extra round trip: the same choice as placement's
(docs/router.md, "Several router replicas"). Replica ids are pod names in
cluster mode.

What remains: for up to one status interval after a replica starts (until
the others have read a report that lists it), or ~10 s after one stops
(until the workers drop it), two replicas, or none, may act for some models.
Two adding the same copy choose the same pod (deterministic placement) and
the worker loads it once; none acting delays a change by those seconds.
Requests never wait for this: cold loads on the request path are not gated.
"""
from __future__ import annotations

from typing import Callable, Iterable

from hotset_router.placement import rendezvous_score


class Replicas:
    def __init__(self, me: str, listed: Callable[[], Iterable[str]] = lambda: ()) -> None:
        self.me = me
        self.listed = listed  # the replicas the workers list (model_map.router_ids)

    def live(self) -> set[str]:
        return {self.me, *self.listed()}

    def owner(self, model: str) -> str:
        return max(self.live(), key=lambda replica: (rendezvous_score(model, replica), replica))

    def owns(self, model: str) -> bool:
        """Whether this replica carries out the copy loop's decisions for `model`."""
        live = self.live()
        if len(live) == 1:
            return True
        return max(live, key=lambda replica: (rendezvous_score(model, replica), replica)) == self.me
