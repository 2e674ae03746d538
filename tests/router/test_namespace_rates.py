"""rates.NamespaceRates on its own, with a clock the test moves (the real ModelQuota through a real
router: test_callers_kubernetes.py), and RequestRate read from a ModelQuota's spec."""
from __future__ import annotations

import pytest

from hotset_common import errors
from hotset_common.spec import RequestRate
from hotset_router.rates import NamespaceRates


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_namespace_gets_its_burst_then_its_rate_and_others_are_not_counted():
    clock, replicas = Clock(), [1]
    limits = {"team-a": RequestRate(2.0, 4)}
    rates = NamespaceRates(limits.get, lambda: replicas[0], clock)
    for _ in range(4):
        rates.take("team-a")
    with pytest.raises(errors.TooManyRequests, match="allows 2 requests a second") as refused:
        rates.take("team-a")
    assert refused.value.status_code == 429 and refused.value.headers["Retry-After"] == "1"
    for _ in range(100):
        rates.take("team-b")  # no limit
        rates.take(None)  # a model no ServedModel declares
    clock.now += 0.5  # one token back
    rates.take("team-a")
    with pytest.raises(errors.TooManyRequests):
        rates.take("team-a")
    # two replicas: each allows half
    replicas[0] = 2
    clock.now += 10
    rates.take("team-a")
    rates.take("team-a")
    with pytest.raises(errors.TooManyRequests, match="1 through each of 2"):
        rates.take("team-a")


@pytest.mark.parametrize("spec, rate", [
    ({}, None), ({"requestsPerSecond": 0}, None), ({"requestsPerSecond": "x"}, None),
    ({"requestsPerSecond": 2.5}, RequestRate(2.5, 3)), ({"requestsPerSecond": 0.1}, RequestRate(0.1, 1)),
    ({"requestsPerSecond": 10, "burst": 50}, RequestRate(10.0, 50)),
])
def test_request_rate_of_a_modelquota(spec, rate):
    assert RequestRate.of_quota(spec) == rate


def test_the_strictest_of_several_quotas_holds():
    assert RequestRate.strictest([RequestRate(5, 10), RequestRate(2, 20)]) == RequestRate(2, 10)
    assert RequestRate.strictest([]) is None
