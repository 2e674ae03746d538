"""Replication policy with an injected clock: when copies are added and removed, and the churn guard."""
from __future__ import annotations

from hotset_router.replication import Action, ModelLimits, ReplicationPolicy, ReplicationSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SETTINGS = ReplicationSettings(rps_per_copy=10, inflight_per_copy=4, window_s=2, idle_s=30, churn_guard_s=20)


def send(policy: ReplicationPolicy, clock: Clock, model: str, rps: float, seconds: float) -> None:
    for _ in range(int(rps * seconds)):
        clock.now += 1 / rps
        policy.record_request(model)


def test_sustained_rate_above_threshold_adds_a_copy_up_to_max():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    send(policy, clock, "hot", rps=50, seconds=2)
    assert policy.decide("hot", 1, 0, 0, ModelLimits(0, 2)) == Action("add", "hot")
    assert policy.decide("hot", 2, 0, 0, ModelLimits(0, 2)) is None  # 25 rps per copy, but max reached


def test_rate_below_threshold_adds_nothing_and_cold_models_are_left_to_placement():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    send(policy, clock, "warm", rps=5, seconds=2)
    assert policy.decide("warm", 1, 0, 0, ModelLimits(0, 4)) is None
    assert policy.decide("warm", 0, 0, 0, ModelLimits(0, 4)) is None


def test_queueing_alone_adds_a_copy():
    policy = ReplicationPolicy(SETTINGS, Clock())
    assert policy.decide("slow", 1, 0, 9, ModelLimits(0, 3)) == Action("add", "slow")


def test_no_second_change_while_a_copy_is_loading():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    send(policy, clock, "hot", rps=50, seconds=2)
    assert policy.decide("hot", 1, 1, 0, ModelLimits(0, 4)) is None


def test_extra_copy_goes_after_the_idle_period_but_not_before():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    send(policy, clock, "hot", rps=50, seconds=2)
    assert policy.decide("hot", 1, 0, 0, ModelLimits(0, 2)).kind == "add"
    clock.now += 5
    assert policy.decide("hot", 2, 0, 0, ModelLimits(0, 2)) is None  # idle, but not for 30 s yet
    clock.now += 29
    assert policy.decide("hot", 2, 0, 0, ModelLimits(0, 2)) is None
    clock.now += 2
    assert policy.decide("hot", 2, 0, 0, ModelLimits(0, 2)) == Action("remove", "hot")


def test_never_below_min_copies_nor_the_last_copy():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    for _ in range(5):
        clock.now += 100
        assert policy.decide("m", 2, 0, 0, ModelLimits(2, 4)) is None
        assert policy.decide("n", 1, 0, 0, ModelLimits(0, 4)) is None


def test_churn_guard_blocks_scale_up_right_after_a_scale_down():
    clock = Clock()
    policy = ReplicationPolicy(SETTINGS, clock)
    policy.decide("m", 2, 0, 0, ModelLimits(0, 2))
    clock.now += 100
    assert policy.decide("m", 2, 0, 0, ModelLimits(0, 2)) == Action("remove", "m")
    send(policy, clock, "m", rps=50, seconds=2)  # hot again at once
    assert policy.decide("m", 1, 0, 0, ModelLimits(0, 2)) is None
    clock.now += 20
    send(policy, clock, "m", rps=50, seconds=2)
    assert policy.decide("m", 1, 0, 0, ModelLimits(0, 2)) == Action("add", "m")
