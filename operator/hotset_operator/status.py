"""ServedModel status from what the worker pods report: copies, readyReplicas, Ready.

Pure functions: the timer handler feeds them the pods' reports and writes the
result only when it differs from what the object already says.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState, ModelCopy, WorkerStatus


def copy_entry(pod: str, copy: ModelCopy) -> dict[str, Any]:
    """One copy as ``status.copies[]`` lists it (the one place that says so: the fleet's index
    of every pass and `copies_of` both use it, so a field the CRD shows cannot be dropped by one)."""
    entry: dict[str, Any] = {"pod": pod, "state": copy.state.value, "bytes": copy.bytes}
    if copy.reason:
        entry["reason"] = copy.reason
    if copy.failure:
        entry["failure"] = copy.failure
    if copy.progress:
        entry["progress"] = copy.progress
    return entry


def copies_of(model: str, reports: Mapping[str, WorkerStatus]) -> list[dict[str, Any]]:
    """Every copy of `model` on any pod, in pod order, as the status field lists them."""
    return [copy_entry(pod, copy) for pod in sorted(reports) for copy in reports[pod].models if copy.id == model]


def readiness(spec: ModelSpec, copies: list[dict[str, Any]],
              pod_problems: Sequence[str] = ()) -> tuple[bool, str, str]:
    """(Ready, reason, message): ready when min copies are loaded; a failed load says why.

    `pod_problems` are the kubelet's reasons why pods that must hold this model
    (its dedicated group) are not running, e.g. a pinned load failing the startup
    probe until the container restarts in CrashLoopBackOff.
    """
    ready = sum(1 for c in copies if c["state"] == CopyState.READY.value)
    required = spec.replicas.min
    failed = [c for c in copies if c["state"] == CopyState.FAILED.value]
    if ready >= required and ready > 0:
        return True, "CopiesReady", f"{ready} of {required} required copies ready"
    if failed:
        first = failed[0]
        if first.get("failure") == "WarmupFailed":
            return False, "WarmupFailed", f"warm-up on pod {first['pod']} failed: {first.get('reason') or 'no reason given'}"
        return False, "LoadFailed", f"load on pod {first['pod']} failed: {first.get('reason') or 'no reason given'}"
    if pod_problems:
        return False, "PodsFailing", f"{ready} of {required} required copies ready; {pod_problems[0]}"
    fetching = next((c for c in copies if c.get("progress")), None)
    if required == 0:
        if fetching is not None:  # still ready to take requests: they wait for this load
            return True, "LoadOnDemand", f"no copies required; pod {fetching['pod']}: {fetching['progress']}"
        return True, "LoadOnDemand", "no copies required; the router loads the model on its first request"
    if fetching is not None:
        return False, "Downloading", f"{ready} of {required} required copies ready; pod {fetching['pod']}: {fetching['progress']}"
    return False, "WaitingForCopies", f"{ready} of {required} required copies ready"
