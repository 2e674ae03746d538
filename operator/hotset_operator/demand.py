"""Which copies a pool should hold, from what its workers report.

The signals, each from the workers' own ``GET /status``:

- **placements that do not fit**: requests waiting in a worker's admission
  queue for a model that has no room there (``waiting``), once they have
  waited ``queue_wait_s``;
- **saturated copies**: in-flight plus queued requests per copy above
  ``target_inflight_per_copy`` (the router's replication threshold), so
  another copy is wanted, on another pod;
- **recent use**: a copy used within the model's ``replicas.idleSeconds``, or
  a request the router held for a pod of the model (its ``wanted-at``
  annotation) within that time;
- the declared ``replicas.min``.

A model evicted for lack of room disappears from the reports while it is
still wanted, so when each model was last seen wanted is remembered
(``DemandMemory``, with an injected clock) for its idle time.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState, WorkerStatus
from hotset_operator.pool import Want

HELD = (CopyState.READY, CopyState.LOADING)


class DemandMemory:
    """When each model was last seen wanted (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, float] = {}

    def note(self, model: str, ago_s: float = 0.0) -> None:
        at = self.clock() - max(0.0, ago_s)
        self._seen[model] = max(self._seen.get(model, at), at)

    def idle_for(self, model: str) -> float:
        """Seconds since `model` was last seen wanted (infinite: never)."""
        seen = self._seen.get(model)
        return math.inf if seen is None else self.clock() - seen

    def remembered(self) -> set[str]:
        return set(self._seen)

    def forget_all_but(self, models: Iterable[str] | Mapping[str, object]) -> None:
        keep = models if isinstance(models, Mapping) else set(models)
        self._seen = {m: at for m, at in self._seen.items() if m in keep}


@dataclass(frozen=True)
class Load:
    """What the reports say of one model across a set of pods."""

    copies: int  # held (ready or loading)
    requests: int  # in flight + queued on its copies + waiting for room
    waited_s: float  # longest wait for room of one of its requests (0: none waits)
    used_ago_s: float  # since its most recently used copy was used (inf: no copy)
    bytes: int  # measured size of a copy (0: none measured)


def load_of(model: str, reports: Iterable[WorkerStatus]) -> Load:
    return loads(reports).get(model, IDLE)


IDLE = Load(0, 0, 0.0, math.inf, 0)


def loads(reports: Iterable[WorkerStatus]) -> dict[str, Load]:
    """What the reports say of every model they name, in one pass over them (a pass costs the
    copies and waiting models reported, not the models that exist)."""
    found: dict[str, list[float]] = {}  # model -> [copies, requests, waited, used_ago, bytes]
    for report in reports:
        for copy in report.models:
            if copy.state not in HELD:
                continue
            load = found.setdefault(copy.id, [0, 0, 0.0, math.inf, 0])
            load[0] += 1
            load[1] += copy.inflight + copy.queued
            load[4] = max(load[4], copy.bytes if copy.state is CopyState.READY else 0)
            if copy.state is CopyState.READY and copy.frequency > 0:
                load[3] = min(load[3], copy.last_used_s)
        for waiting in report.waiting:
            load = found.setdefault(waiting.id, [0, 0, 0.0, math.inf, 0])
            load[1] += waiting.requests
            load[2] = max(load[2], waiting.waited_s)
    return {model: Load(int(c), int(r), w, u, int(b)) for model, (c, r, w, u, b) in found.items()}


def note_use(memory: DemandMemory, key: str, load: Load, wanted_at: float, now_wall: float) -> None:
    """Remember what the reports (and the router's annotation) say about when `key` was last wanted."""
    if load.requests > 0:
        memory.note(key)
    if math.isfinite(load.used_ago_s):
        memory.note(key, load.used_ago_s)
    if wanted_at > 0 and now_wall >= wanted_at:
        memory.note(key, now_wall - wanted_at)


def copies_for(spec: ModelSpec, load: Load, recent: bool, target_inflight: float) -> tuple[int, str]:
    """Copies `spec` should have, and why: min, recent use, or saturation, within replicas.max."""
    saturated = min(math.ceil(load.requests / target_inflight), spec.replicas.max)
    wanted = max(spec.replicas.min, 1 if recent else 0, saturated)
    if saturated > 1 and saturated >= max(spec.replicas.min, 1):
        why = f"{load.requests} requests on {max(load.copies, 1)} copies (target {target_inflight:g} per copy)"
    elif load.waited_s > 0 and load.copies == 0:
        why = f"waiting {load.waited_s:.1f}s for room"
    elif recent and spec.replicas.min == 0:
        why = "in use"
    else:
        why = "min"
    return wanted, why


def pool_wants(specs: Mapping[str, ModelSpec], reports: Mapping[str, WorkerStatus], wanted_at: Mapping[str, float],
               memory: DemandMemory, now_wall: float, target_inflight: float, queue_wait_s: float) -> list[Want]:
    """The copies a shared pool should hold for `specs` (its accepted shared models).

    Only models that can want a copy are looked at: declared minimums, what the reports name,
    what is remembered as recently wanted, and requests the router held for a pod (`wanted_at`),
    so an idle catalog of thousands of models costs one scan for minimums."""
    reported = loads(reports.values())
    candidates = ({model for model, spec in specs.items() if spec.replicas.min > 0} | set(reported)
                  | memory.remembered() | set(wanted_at))
    wants = []
    for model in sorted(candidates):
        spec = specs.get(model)
        if spec is None:
            continue
        load = reported.get(model, IDLE)
        if load.requests and load.copies == 0 and load.waited_s < queue_wait_s:
            load = Load(load.copies, 0, load.waited_s, load.used_ago_s, load.bytes)  # a moment's wait is no signal
        note_use(memory, model, load, wanted_at.get(model, 0.0), now_wall)
        recent = memory.idle_for(model) < spec.replicas.idle_seconds
        copies, why = copies_for(spec, load, recent, target_inflight)
        held_for_a_pod = 0 <= now_wall - wanted_at.get(model, 0.0) < spec.replicas.idle_seconds
        if copies:
            required = max(spec.replicas.min, 1 if held_for_a_pod else 0)
            wants.append(Want(model, load.bytes or spec.memory_bytes, copies, why, required))
    memory.forget_all_but(specs)
    return wants


def dedicated_pods(spec: ModelSpec, reports: Iterable[WorkerStatus], wanted_at: float, memory: DemandMemory,
                   now_wall: float, target_inflight: float) -> tuple[int, str]:
    """Pods a dedicated group should run (each holds one pinned copy), and why; 0 only with min 0 once idle."""
    load = load_of(spec.id, reports)
    note_use(memory, spec.id, load, wanted_at, now_wall)
    idle = memory.idle_for(spec.id)
    recent = idle < spec.replicas.idle_seconds
    pods, why = copies_for(spec, load, recent, target_inflight)
    if pods == 0:
        why = ("idle: no request yet" if math.isinf(idle)
               else f"idle for {idle:.0f}s (replicas.idleSeconds {spec.replicas.idle_seconds})")
    return pods, why
