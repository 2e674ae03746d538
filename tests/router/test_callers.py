"""callers.Callers on its own, with a stand-in for the API server's reviews (the real one:
test_callers_kubernetes.py): what is cached and for how long, one review for callers that ask at
once, and an API server that does not answer."""
from __future__ import annotations

import asyncio
import threading

import pytest

from hotset_common import errors, wire
from hotset_router.callers import AuthMode, Caller, CallerSettings, Callers

SETTINGS = CallerSettings(mode=AuthMode.KUBERNETES, cache_s=30, refused_cache_s=5)
OWNERS = {"alpha": "tenant-a", "beta": "tenant-b"}


class StandInReviews:
    """Answers as an API server with one token (``good``) for tenant-a's ``app``, allowed in tenant-a."""

    def __init__(self) -> None:
        self.asked: list[tuple] = []
        self.broken = False
        self.gate: threading.Event | None = None
        self.grants = {("system:serviceaccount:tenant-a:app", "tenant-a")}

    def who(self, token: str) -> Caller | None:
        self.asked.append(("who", token))
        if self.gate is not None:
            self.gate.wait(5)
        if self.broken:
            raise ConnectionRefusedError("the API server is down")
        return Caller("system:serviceaccount:tenant-a:app", "uid-1", ("system:serviceaccounts",)) if token == "good" \
            else None

    def may(self, caller: Caller, namespace: str, name: str | None) -> bool:
        self.asked.append(("may", namespace, name))
        return (caller.name, namespace) in self.grants


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def callers(reviews: StandInReviews, clock: Clock) -> Callers:
    return Callers(reviews, OWNERS.get, SETTINGS, clock)


def bearer(token: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **more}


def test_answers_are_kept_for_their_time_and_refusals_for_less():
    reviews, clock = StandInReviews(), Clock()
    checker = callers(reviews, clock)

    async def scenario() -> None:
        await checker.check(bearer("good"), "alpha")
        await checker.check(bearer("good"), "alpha")
        assert reviews.asked == [("who", "good"), ("may", "tenant-a", "alpha")]
        with pytest.raises(errors.Forbidden, match="servedmodels/predict"):
            await checker.check(bearer("good"), "beta")
        reviews.grants.add(("system:serviceaccount:tenant-a:app", "tenant-b"))
        clock.now = 4.9  # the refusal is still kept
        with pytest.raises(errors.Forbidden):
            await checker.check(bearer("good"), "beta")
        clock.now = 5.1  # ...and then asked again
        await checker.check(bearer("good"), "beta")
        assert len(reviews.asked) == 4
        clock.now = 31  # the identity and the first grant expire
        await checker.check(bearer("good"), "alpha")
        assert reviews.asked[-2:] == [("who", "good"), ("may", "tenant-a", "alpha")]

    asyncio.run(scenario())


def test_missing_or_unknown_tokens_other_namespaces_and_unknown_models():
    reviews, clock = StandInReviews(), Clock()
    checker = callers(reviews, clock)

    async def scenario() -> None:
        with pytest.raises(errors.Unauthorized, match="Authorization: Bearer"):
            await checker.check({}, "alpha")
        with pytest.raises(errors.Unauthorized, match="authenticates nobody"):
            await checker.check(bearer("stolen"), "alpha")
        with pytest.raises(errors.ModelNotFound, match="in namespace 'tenant-b'"):
            await checker.check(bearer("good", **{wire.NAMESPACE_HEADER: "tenant-b"}), "alpha")
        with pytest.raises(errors.ModelNotFound, match="not declared"):
            await checker.check(bearer("good"), "gamma")
        assert await checker.visible(bearer("good"), ["alpha", "beta", "gamma"]) == ["alpha"]

    asyncio.run(scenario())


def test_callers_asking_at_once_share_one_review_and_a_failed_one_is_a_503_not_kept():
    reviews, clock = StandInReviews(), Clock()
    checker = callers(reviews, clock)

    async def scenario() -> None:
        reviews.gate = threading.Event()
        waiting = [asyncio.ensure_future(checker.check(bearer("good"), "alpha")) for _ in range(10)]
        await asyncio.sleep(0.05)
        reviews.gate.set()
        await asyncio.gather(*waiting)
        assert [a for a in reviews.asked if a[0] == "who"] == [("who", "good")]
        reviews.gate, reviews.broken = None, True
        with pytest.raises(errors.BackendUnavailable, match="Kubernetes API") as refused:
            await checker.check(bearer("other"), "alpha")
        assert refused.value.headers["Retry-After"] == "5"
        reviews.broken = False
        with pytest.raises(errors.Unauthorized):  # asked again: the failure was not an answer
            await checker.check(bearer("other"), "alpha")
        assert reviews.asked.count(("who", "other")) == 2

    asyncio.run(scenario())


def test_unchecked_callers_still_address_by_namespace():
    checker = Callers(None, OWNERS.get)

    async def scenario() -> None:
        await checker.check({}, "alpha")
        await checker.check({wire.NAMESPACE_HEADER: "tenant-a"}, "alpha")
        with pytest.raises(errors.ModelNotFound):
            await checker.check({wire.NAMESPACE_HEADER: "tenant-b"}, "alpha")
        assert await checker.visible({wire.NAMESPACE_HEADER: "tenant-b"}, ["alpha", "beta"]) == ["beta"]

    asyncio.run(scenario())
