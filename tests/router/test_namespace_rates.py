"""rates.NamespaceRates on its own, with a clock the test moves (the real ModelQuota through a real
router: test_callers_kubernetes.py), RequestRate and ServingTerms read from a ModelQuota's spec, and
the share-weight header the router sends its workers."""
from __future__ import annotations

import pytest

from hotset_common import errors, wire
from hotset_common.spec import RequestRate, ServingTerms
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


@pytest.mark.parametrize("spec, weight", [
    ({}, 1.0), ({"servingWeight": 4}, 4.0), ({"servingWeight": 0.5}, 0.5), ({"servingWeight": "x"}, 1.0),
    ({"servingWeight": -2}, 1.0), ({"servingWeight": 5000}, 1.0),
])
def test_serving_weight_of_a_modelquota(spec, weight):
    assert ServingTerms.of_quota(spec).weight == weight


def test_several_quotas_give_the_strictest_rate_and_the_smallest_weight():
    terms = ServingTerms.strictest([ServingTerms(RequestRate(5, 10), 4.0), ServingTerms(None, 2.0)])
    assert terms == ServingTerms(RequestRate(5, 10), 2.0)
    assert not ServingTerms.of_quota({})  # sets nothing: not kept


@pytest.mark.parametrize("value, parsed", [
    ("team-a=2", ("team-a", 2.0)), ("team-a=0.5", ("team-a", 0.5)), (None, None), ("", None), ("team-a", None),
    ("=2", None), ("team-a=x", None), ("team-a=0", None), ("team-a=-1", None), ("team-a=inf", None),
])
def test_the_share_weight_header_is_read_or_ignored(value, parsed):
    assert wire.parse_share_weight(value) == parsed
    if parsed:
        assert wire.parse_share_weight(wire.share_weight(*parsed)) == parsed
