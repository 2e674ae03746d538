"""Shrinking a pool without dropping what is wanted: the emptiest pod goes first, once emptied.

One step per convergence, a pure function of the pool's pods and their reports:

1. A pool asked to shrink while some of its pods are not ready (still
   starting) loses one of those first: nothing runs there yet, and the
   ReplicaSet controller removes unready pods before ready ones anyway.
2. Otherwise the emptiest ready pod (fewest bytes of wanted copies, then of
   any copies, then fewest requests) is marked draining: the router places
   nothing new on it, sends its requests to other copies where they exist,
   and loads elsewhere the copies still wanted (its ``replicas.min`` copies
   and those used within their idle time). Its pod-deletion-cost is set
   lowest, so the ReplicaSet removes exactly this pod.
3. Once nothing runs or waits on it and every wanted copy it held is ready on
   another pod (or ``drain_timeout_s`` passed), the Deployment loses one
   replica. Idle copies are simply dropped with the pod.

Growth, or demand back at the current size, cancels a drain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState, WorkerStatus


@dataclass(frozen=True)
class PoolPod:
    name: str
    ready: bool
    draining_since: float | None = None  # unix seconds, from the drain annotation
    report: WorkerStatus | None = None


@dataclass(frozen=True)
class Step:
    replicas: int  # the Deployment's replicas after this step
    drain: str = ""  # a pod to start draining
    undrain: tuple[str, ...] = ()  # pods whose drain is cancelled
    removes: str = ""  # the drained pod the new replicas let go
    reason: str = ""


def _wanted(copy_id: str, last_used_s: float, frequency: float, specs: Mapping[str, ModelSpec]) -> bool:
    spec = specs.get(copy_id)
    if spec is None:
        return False
    return spec.replicas.min > 0 or (frequency > 0 and last_used_s < spec.replicas.idle_seconds)


def _ready_elsewhere(model: str, pod: str, pods: Sequence[PoolPod]) -> int:
    return sum(1 for p in pods if p.name != pod and p.draining_since is None and p.report is not None
               and any(c.id == model and c.state is CopyState.READY for c in p.report.models))


def emptiness(pod: PoolPod, specs: Mapping[str, ModelSpec]) -> tuple[int, int, int, str]:
    """Sort key: bytes of wanted copies, bytes of all copies, requests on it, name."""
    report = pod.report
    if report is None:
        return 0, 0, 0, pod.name
    wanted = sum(c.bytes for c in report.models if _wanted(c.id, c.last_used_s, c.frequency, specs))
    requests = sum(c.inflight + c.queued for c in report.models) + report.queued_requests
    return wanted, report.used_bytes, requests, pod.name


def unmoved(pod: PoolPod, pods: Sequence[PoolPod], specs: Mapping[str, ModelSpec]) -> list[str]:
    """Wanted copies on `pod` that no other (staying) pod holds ready enough times yet."""
    if pod.report is None:
        return []
    missing = []
    for copy in pod.report.models:
        if copy.state is not CopyState.READY or not _wanted(copy.id, copy.last_used_s, copy.frequency, specs):
            continue
        if _ready_elsewhere(copy.id, pod.name, pods) < max(specs[copy.id].replicas.min, 1):
            missing.append(copy.id)
    return sorted(missing)


def busy(pod: PoolPod) -> int:
    """Requests running or waiting on the pod."""
    if pod.report is None:
        return 0
    return sum(c.inflight + c.queued for c in pod.report.models) + pod.report.queued_requests


def plan(pods: Sequence[PoolPod], current: int, target: int, specs: Mapping[str, ModelSpec],
         now: float, drain_timeout_s: float) -> Step:
    """The next step from `current` replicas towards `target` (`specs`: the pool's shared models)."""
    draining = [p for p in pods if p.draining_since is not None]
    if target >= current:
        return Step(target, undrain=tuple(p.name for p in draining),
                    reason="" if target == current else f"grows from {current} to {target} pods")
    if len(pods) < current or any(not p.ready for p in pods):
        return Step(current - 1, undrain=tuple(p.name for p in draining),
                    reason=f"shrinks to {current - 1} pods: removes a pod that is not ready")
    if not draining:
        chosen = min(pods, key=lambda p: emptiness(p, specs))
        return Step(current, drain=chosen.name, reason=f"draining {chosen.name}, the emptiest pod, to shrink to {target}")
    pod, others = draining[0], tuple(p.name for p in draining[1:])
    waiting_for = unmoved(pod, pods, specs)
    requests = busy(pod)
    timed_out = now - (pod.draining_since or now) >= drain_timeout_s
    if (not waiting_for and not requests) or timed_out:
        why = "timed out draining" if timed_out and (waiting_for or requests) else "drained"
        return Step(current - 1, undrain=others, removes=pod.name, reason=f"shrinks to {current - 1} pods: {pod.name} {why}")
    detail = []
    if waiting_for:
        detail.append(f"waiting for {', '.join(waiting_for)} to be ready on another pod")
    if requests:
        detail.append(f"{requests} requests still on it")
    return Step(current, undrain=others, reason=f"draining {pod.name}: " + "; ".join(detail))
