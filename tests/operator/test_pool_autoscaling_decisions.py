"""What the autoscaler decides from worker reports, with an injected clock (pure functions, no servers).

The same decisions run against real components in test_pool_scales_with_demand.py.
"""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState, ModelCopy, WaitingModel, WorkerStatus
from hotset_operator import autoscaler, demand, drain, quota_bounds
from hotset_operator.index import Quota
from hotset_operator.pool import Want

GI = 2**30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spec(name: str, gib: float = 1, min_copies: int = 0, max_copies: int = 4, idle: int = 60) -> ModelSpec:
    return ModelSpec(id=name, framework="torchvision", source=f"pvc://m/{name}", memory=int(gib * GI),
                     replicas={"min": min_copies, "max": max_copies, "idleSeconds": idle})


def report(pod: str, *copies: ModelCopy, waiting: tuple[WaitingModel, ...] = (), used: int = 0) -> WorkerStatus:
    return WorkerStatus(pod=pod, ready=True, triton_ready=True, memory_budget_bytes=4 * GI, used_bytes=used,
                        free_bytes=4 * GI - used, models=list(copies), waiting=list(waiting),
                        queued_requests=sum(w.requests for w in waiting), catalog=[])


def copy(model: str, gib: float = 1, inflight: int = 0, queued: int = 0, used_ago: float = 1.0,
         frequency: float = 1.0) -> ModelCopy:
    return ModelCopy(id=model, framework="torchvision", state=CopyState.READY, bytes=int(gib * GI), inflight=inflight,
                     queued=queued, last_used_s=used_ago, frequency=frequency)


def wants(specs: dict[str, ModelSpec], reports: dict[str, WorkerStatus], memory: demand.DemandMemory,
          wanted_at: dict[str, float] | None = None) -> list[Want]:
    return demand.pool_wants(specs, reports, wanted_at or {}, memory, now_wall=5000.0, target_inflight=4,
                             queue_wait_s=1.0)


def test_requests_waiting_for_room_make_the_pool_grow_to_fit_them():
    clock = Clock()
    specs = {m: spec(m, 2) for m in "abcd"}  # 2 GiB each; a pod holds 4 GiB
    one_pod = {"p1": report("p1", copy("a", 2), copy("b", 2), used=4 * GI,
                            waiting=(WaitingModel(id="c", requests=3, waited_s=2.5),
                                     WaitingModel(id="d", requests=1, waited_s=0.2)))}
    found = wants(specs, one_pod, demand.DemandMemory(clock))
    # d has waited only a moment: not yet a signal; c waited 2.5 s for room it cannot get
    assert sorted(w.model for w in found) == ["a", "b", "c"]
    target = autoscaler.pool_target(found, 4 * GI, min_pods=1, max_pods=8)
    assert (target.pods, target.lower_bound) == (2, 2)
    assert "c: waiting 2.5s for room" in target.reason


def test_a_saturated_copy_wants_more_copies_each_on_its_own_pod():
    clock = Clock()
    found = wants({"hot": spec("hot", 1, max_copies=3)}, {"p1": report("p1", copy("hot", inflight=10, queued=6))},
                  demand.DemandMemory(clock))
    assert [(w.model, w.copies) for w in found] == [("hot", 3)]  # 16 requests / 4 per copy = 4, capped at max 3
    assert autoscaler.pool_target(found, 4 * GI, 1, 8).pods == 3  # copies of one model never share a pod


def test_an_evicted_model_stays_wanted_for_its_idle_time_then_is_forgotten():
    clock = Clock()
    memory = demand.DemandMemory(clock)
    specs = {"a": spec("a", idle=60)}
    assert [w.model for w in wants(specs, {"p1": report("p1", copy("a", used_ago=5))}, memory)] == ["a"]
    clock.now += 30
    assert [w.model for w in wants(specs, {"p1": report("p1")}, memory)] == ["a"]  # evicted, but used 35 s ago
    clock.now += 30
    assert wants(specs, {"p1": report("p1")}, memory) == []  # 65 s > idleSeconds


def test_a_request_held_for_a_pod_is_a_floor_an_external_autoscaler_cannot_go_below():
    memory = demand.DemandMemory(Clock())
    found = wants({"a": spec("a")}, {}, memory, wanted_at={"a": 4990.0})  # the router's annotation, 10 s ago
    assert [(w.model, w.copies, w.required) for w in found] == [("a", 1, 1)]
    assert autoscaler.pool_target(found, 4 * GI, min_pods=0, max_pods=4).floor == 1


def test_the_pool_never_passes_its_maximum_and_says_so():
    found = [Want(m, 3 * GI, 1, "in use") for m in "abcdef"]
    target = autoscaler.pool_target(found, 4 * GI, min_pods=1, max_pods=4)
    assert target.pods == 4 and target.packed == 6
    assert target.reason.startswith("at its maximum of 4 pods")


def test_growth_is_immediate_and_shrinking_waits_for_the_delay():
    clock = Clock()
    stabilizer = autoscaler.Stabilizer(delay_s=60, clock=clock)
    assert stabilizer.settle("pool", target=4, current=1) == (4, 0.0)
    assert stabilizer.settle("pool", target=2, current=4) == (4, 60.0)
    clock.now += 59
    assert stabilizer.settle("pool", target=2, current=4)[0] == 4
    assert stabilizer.settle("pool", target=4, current=4) == (4, 0.0)  # demand came back: the wait restarts
    assert stabilizer.settle("pool", target=2, current=4)[0] == 4
    clock.now += 60
    assert stabilizer.settle("pool", target=2, current=4) == (2, 0.0)


def test_a_min_zero_dedicated_group_scales_to_zero_only_after_its_idle_time():
    clock = Clock()
    memory = demand.DemandMemory(clock)
    model = spec("solo", min_copies=0, max_copies=3, idle=120)
    assert demand.dedicated_pods(model, [], wanted_at=0.0, memory=memory, now_wall=5000.0, target_inflight=4)[0] == 0
    # a request held for a pod (the router's annotation) wakes it
    assert demand.dedicated_pods(model, [], wanted_at=4999.0, memory=memory, now_wall=5000.0, target_inflight=4)[0] == 1
    busy = [report("d1", copy("solo", inflight=9))]
    assert demand.dedicated_pods(model, busy, 4999.0, memory, 5000.0, 4)[0] == 3  # 9 requests: 3 pods (max 3)
    clock.now += 100
    idle = [report("d1", copy("solo", used_ago=100))]
    assert demand.dedicated_pods(model, idle, 4999.0, memory, 5100.0, 4)[0] == 1
    clock.now += 30
    pods, why = demand.dedicated_pods(model, [report("d1", copy("solo", used_ago=130))], 4999.0, memory, 5130.0, 4)
    assert pods == 0 and "idle for 130s" in why


def pool_pod(name: str, *copies: ModelCopy, ready: bool = True, draining: float | None = None) -> drain.PoolPod:
    return drain.PoolPod(name, ready, draining, report(name, *copies, used=sum(c.bytes for c in copies)))


def test_shrinking_drains_the_emptiest_pod_first():
    specs = {m: spec(m, min_copies=1 if m == "pinned-min" else 0) for m in ("pinned-min", "a", "idle")}
    pods = [pool_pod("p1", copy("pinned-min"), copy("a")), pool_pod("p2", copy("idle", used_ago=999, frequency=0)),
            pool_pod("p3", copy("a"))]
    step = drain.plan(pods, current=3, target=2, specs=specs, now=100.0, drain_timeout_s=60)
    assert (step.replicas, step.drain) == (3, "p2")  # holds only a copy no one wants


def test_a_drained_pod_goes_once_its_wanted_copies_are_ready_elsewhere():
    specs = {"m": spec("m", min_copies=1)}
    pods = [pool_pod("p1", copy("m"), draining=90.0), pool_pod("p2")]
    step = drain.plan(pods, current=2, target=1, specs=specs, now=100.0, drain_timeout_s=60)
    assert step.replicas == 2 and "waiting for m to be ready on another pod" in step.reason
    pods[1] = pool_pod("p2", copy("m"))  # the router loaded it there
    step = drain.plan(pods, current=2, target=1, specs=specs, now=101.0, drain_timeout_s=60)
    assert (step.replicas, step.removes) == (1, "p1")


def test_requests_on_a_drained_pod_hold_it_until_the_timeout():
    pods = [pool_pod("p1", copy("m", inflight=2), draining=90.0), pool_pod("p2", copy("m"))]
    assert drain.plan(pods, 2, 1, {"m": spec("m")}, now=100.0, drain_timeout_s=60).replicas == 2
    assert drain.plan(pods, 2, 1, {"m": spec("m")}, now=151.0, drain_timeout_s=60).replicas == 1


def test_a_pod_still_starting_goes_before_any_drain_and_growth_cancels_drains():
    pods = [pool_pod("p1", copy("a")), pool_pod("p2", ready=False)]
    step = drain.plan(pods, current=2, target=1, specs={"a": spec("a")}, now=0.0, drain_timeout_s=60)
    assert (step.replicas, step.drain) == (1, "")
    pods = [pool_pod("p1", copy("a"), draining=1.0), pool_pod("p2")]
    step = drain.plan(pods, current=2, target=3, specs={"a": spec("a")}, now=0.0, drain_timeout_s=60)
    assert (step.replicas, step.undrain) == (3, ("p1",))


# ----- held within the namespace's ModelQuota (quota_bounds.py) -----------------------------------

def quota(namespace: str = "team", **limits) -> Quota:
    return Quota(namespace=namespace, name="q", **limits)


def in_namespace(model: ModelSpec, namespace: str = "team") -> ModelSpec:
    return model.model_copy(update={"source_options": model.source_options.model_copy(update={"namespace": namespace})})


def test_a_namespace_pools_pods_take_only_the_gpus_its_quota_leaves_beside_its_dedicated_floors():
    """Three copies of 60% of a pod are 1.8 GPUs of shares (what admission counts) but three pods."""
    ledger = quota_bounds.Ledger({"team": [quota(gpus=3)]})
    solo = in_namespace(spec("solo", min_copies=1, max_copies=1))
    unit = quota_bounds.dedicated_unit(solo, pod_gpus=1)
    ledger.hold("team", ("dedicated", "solo-dedicated"), quota_bounds.times(unit, 0), quota_bounds.times(unit, 1))
    cap = ledger.most("team", ("pods", "hotset-pool"), quota_bounds.pod_unit(1), 3, "pods")
    assert cap.allowed == 2
    assert "ModelQuota q of namespace team allows 3 GPUs" in cap.reason and "room for 2 pods (of 3 wanted)" in cap.reason
    ledger.hold("team", ("pods", "hotset-pool"), quota_bounds.times(quota_bounds.pod_unit(1), 2))
    assert ledger.most("team", ("dedicated", "solo-dedicated"), unit, 1, "pods") == quota_bounds.Cap(1)  # its floor
    assert ledger.most("other", ("pods", "hotset-pool"), quota_bounds.pod_unit(1), 9, "pods").allowed == 9  # no quota


def test_a_dedicated_group_grows_only_into_what_the_others_leave():
    ledger = quota_bounds.Ledger({"team": [quota(gpus=4, copies=10)]})
    big = in_namespace(spec("big", min_copies=0, max_copies=3))
    ledger.hold("team", ("pods", "hotset-pool"), quota_bounds.times(quota_bounds.pod_unit(1), 3))
    cap = ledger.most("team", ("dedicated", "big-dedicated"), quota_bounds.dedicated_unit(big, 1), 3, "pods")
    assert cap.allowed == 1 and "its other workloads take 3 GPUs" in cap.reason


def test_wanted_copies_past_the_quota_are_left_out_extras_first():
    """A quota lowered below what demand asks (admission's next pass has not refused a model yet)."""
    specs = {m: in_namespace(spec(m, 1)) for m in "ab"}
    specs["c"] = in_namespace(spec("c", 1), "elsewhere")
    wants = [Want("a", GI, 3, "busy", required=1), Want("b", GI, 1, "min", required=1), Want("c", GI, 5, "busy")]
    ledger = quota_bounds.Ledger({"team": [quota(copies=3)]})
    kept, why = ledger.trim_wants(wants, specs, ("copies", "hotset-pool"),
                                  quota_bounds.copy_unit(4 * GI, 0, gpus_with_copies=True))
    assert [(w.model, w.copies) for w in kept] == [("a", 2), ("b", 1), ("c", 5)]  # a's extra copy went; c has no quota
    assert why == ["1 wanted copies of namespace team left out: ModelQuota q allows 3 copies, and its workloads "
                   "would take 4 copies with them"]
    assert ledger.others("team", ("dedicated", "x")).copies == 3  # what the pool's copies now take
    memory = quota_bounds.Ledger({"team": [quota(memory=GI)]})
    kept, _ = memory.trim_wants(wants[:2], specs, ("copies", "hotset-pool"),
                                quota_bounds.copy_unit(4 * GI, 0, gpus_with_copies=True))
    assert [(w.model, w.copies, w.required) for w in kept] == [("a", 1, 1)]  # required copies go last (ties: by name)
