"""The copy table: which copies a worker holds, in which state, and what each costs. Synchronous.

One writer (the manager, on the event loop) changes it only through the named
state changes below, each a plain method that never awaits, so nothing else
can run half-way through one and no lock is needed. ``check()`` states the
invariants the manager relies on; tests call it after every step.

A copy's life::

    start_load -> LOADING -> finish_load -> READY -> start_unload -> UNLOADING -> finish_unload (gone)
                         \\-> fail_load (gone; the failure is remembered)

A rollout adds a second copy of the same model beside a READY one
(``start_rollout``: its ``replacement``), which ``take_over`` puts in the
table once it is loaded; the old copy then drains in ``leaving``.

What changed is noted for ``GET /status`` (status_report.py) in the table's
``feed`` (changes.py): every state change names the model it touched
(``_changed``), and a copy the table created notes each change to one of its
fields itself (``Copy.__setattr__``: the manager and the admission queue set
``queued``, ``last_used``, ``kept`` and ``transient`` directly). So a report
reads the copies that changed and no others.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from hotset_common import errors
from hotset_common.eviction import Candidate, DecayedCount, EvictionPolicy, choose_victims
from hotset_common.spec import ModelSpec
from hotset_common.wire import CopyState
from hotset_worker.changes import ChangeFeed
from hotset_worker.frameworks.base import FrameworkWorker


@dataclass(eq=False)
class Copy:
    """One model's copy in this pod. Fields change only through CopyTable's state changes."""

    spec: ModelSpec
    state: CopyState
    bytes: int
    loading: "asyncio.Future[None]"  # resolved when the load ends (READY, or the load's error)
    worker: FrameworkWorker | None = None
    inflight: int = 0
    queued: int = 0  # requests waiting for this copy's load to finish (or admitted to it)
    last_used: float = 0.0
    loaded_at: float = 0.0
    promised_to: str | None = None  # a READY copy reserved as the victim of this loading model
    kept: bool = False  # an explicit load (API, pinned) or a rollout asked for it: never transient
    replacement: "Copy | None" = None  # READY: the copy of the new version loading to take over from it
    replaces: "Copy | None" = None  # a rollout's new copy: the one it takes over from
    rollout_error: str = ""  # READY: why the last rollout from it failed (it keeps serving)
    transient: bool = False  # admitted only for the requests that wanted it: unloaded once they are served
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # set while nothing is in flight
    gone: "asyncio.Future[None] | None" = None  # UNLOADING: resolved once unloaded
    # The table's ChangeFeed, set when the table creates the copy: from then on every change to a
    # field is noted for /status (a set insertion; the request path touches a copy two or three times).
    _feed = None

    def __post_init__(self) -> None:
        self.drained.set()

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if self._feed is not None:
            self._feed.touch(self.spec.id)

    @property
    def model_id(self) -> str:
        return self.spec.id

    @property
    def counts_towards_budget(self) -> bool:
        """Every copy that holds (or is about to hold) memory, except ready ones already promised
        to a load as its victims: their bytes are that load's room."""
        return self.state is not CopyState.READY or self.promised_to is None


@dataclass
class ModelStats:
    """What the table remembers of a model across its loads and evictions."""

    demand: DecayedCount
    load_seconds: float | None = None  # its last successful load that imported no code; None: none yet
    measured_bytes: int = 0  # its size at that load


@dataclass(frozen=True)
class Failure:
    """The last failed load of one model: what every retry within the back-off window answers."""

    error: errors.HotsetError
    at: float  # the clock's reading
    load_key: tuple[str, ...] = ()  # the spec that failed (a rollout's failure does not hide the copy serving)

    def backs_off(self) -> bool:
        return not isinstance(self.error, errors.BackendUnavailable)


class TableInvariantBroken(AssertionError):
    """The table is in a state no sequence of its state changes should reach."""


class CopyTable:
    """Copies by model id, the copies of rollouts and those still draining, failures and stats."""

    def __init__(self, memory_budget: int, max_models: int | None, policy: EvictionPolicy,
                 is_pinned: Callable[[str], bool], now: Callable[[], float], half_life_s: float) -> None:
        self.memory_budget = memory_budget
        self.max_models = max_models
        self.policy = policy
        self.is_pinned = is_pinned
        self._now = now
        self._half_life_s = half_life_s
        self.copies: dict[str, Copy] = {}
        self.leaving: set[Copy] = set()  # replaced by a rollout, unloading once drained
        self.failures: dict[str, Failure] = {}
        self.stats: dict[str, ModelStats] = {}
        self._changes = 0
        self.feed = ChangeFeed()  # the models whose copy or failure changed since /status last looked

    # ----- queries ---------------------------------------------------------

    def get(self, model_id: str) -> Copy | None:
        return self.copies.get(model_id)

    def ready(self, model_id: str) -> Copy | None:
        copy = self.copies.get(model_id)
        return copy if copy is not None and copy.state is CopyState.READY else None

    @property
    def half_life_s(self) -> float:
        """The half-life of each model's decayed request count."""
        return self._half_life_s

    @property
    def changes(self) -> int:
        """How many state changes so far (a report can say what changed since a number)."""
        return self._changes

    def all_copies(self) -> Iterator[Copy]:
        """Every copy that holds memory: the table's, the new copies of rollouts in progress, and
        old copies a rollout replaced that are still draining."""
        for copy in self.copies.values():
            yield copy
            if copy.replacement is not None:
                yield copy.replacement
        yield from self.leaving

    def used_bytes(self) -> int:
        return sum(copy.bytes for copy in self.all_copies())

    def committed_bytes(self) -> int:
        return sum(copy.bytes for copy in self.all_copies() if copy.counts_towards_budget)

    def stats_of(self, model_id: str) -> ModelStats:
        stats = self.stats.get(model_id)
        if stats is None:
            stats = self.stats[model_id] = ModelStats(DecayedCount(self._half_life_s))
        return stats

    def known_size(self, spec: ModelSpec) -> int:
        """The best size figure for `spec`: measured at its last load, else its estimate."""
        stats = self.stats.get(spec.id)
        return stats.measured_bytes if stats is not None and stats.measured_bytes > 0 else spec.memory_bytes

    def load_cost(self, model_id: str) -> float:
        """A model's reload seconds for the cost model: its last clean load (one that imported no
        code). Until it has one, 0 (the cost model's floor): such a model is cheap to evict and is
        measured again at its next load, whereas a load that paid for imports would make a model
        look expensive for good (it would never be evicted to be measured again)."""
        stats = self.stats.get(model_id)
        return stats.load_seconds if stats is not None and stats.load_seconds is not None else 0.0

    def candidate(self, copy: Copy, now: float) -> Candidate:
        stats = self.stats_of(copy.model_id)
        return Candidate(
            model_id=copy.model_id, bytes=copy.bytes, idle_s=now - copy.last_used, age_s=now - copy.loaded_at,
            load_seconds=self.load_cost(copy.model_id), frequency=stats.demand.value(now),
            inflight=copy.inflight, queued=copy.queued, priority=copy.spec.priority,
        )

    def victims(self, extra_bytes: int, extra_slots: int, exclude: str | None,
                count_unloading: bool, count_excluded: bool = True,
                forced: Sequence[Candidate] = (), priority: int | None = None) -> list[Candidate] | None:
        """Copies to evict so that everything counted plus the extra fits; None when impossible now.
        `exclude` is never a victim (and with `count_excluded=False` not counted either); `forced`
        go whatever room they free (copies of a latency class the load may not share the pod with),
        and the policy chooses the rest, of at most `priority` (the loading model's).

        A new load (`count_unloading`) waits for copies being unloaded to be gone: their memory is
        not free yet. A finished load does not count them again (their memory is the room of
        loads admitted before it)."""
        counted = [copy for copy in self.all_copies() if copy.counts_towards_budget
                   and (count_unloading or copy.state is not CopyState.UNLOADING)
                   and (count_excluded or copy.model_id != exclude or copy.replaces is not None)]
        bytes_needed = sum(copy.bytes for copy in counted) + extra_bytes - self.memory_budget
        slots_needed = len(counted) + extra_slots - self.max_models if self.max_models else 0
        bytes_needed -= sum(victim.bytes for victim in forced)
        slots_needed -= len(forced)
        if bytes_needed <= 0 and slots_needed <= 0:
            return list(forced)
        going = {victim.model_id for victim in forced}
        rest = choose_victims(self.policy, [c for c in self._candidates(exclude) if c.model_id not in going],
                              bytes_needed, slots_needed, priority)
        return None if rest is None else [*forced, *rest]

    def class_conflicts(self, spec: ModelSpec) -> list[Copy]:
        """Copies `spec` may not share this pod with (``LatencyClass.excludes``), unless already leaving."""
        excluded = spec.latency_class.excludes()
        if excluded is None:
            return []
        return [copy for key, copy in self.copies.items()
                if copy.spec.latency_class is excluded and copy.state is not CopyState.UNLOADING and key != spec.id]

    def evictable_now(self, copies: Iterable[Copy]) -> list[Candidate] | None:
        """`copies` as victims, if every one may be evicted now (ready, unpinned, not promised to
        another load, nobody waiting for it); None if any may not yet."""
        ids = {copy.model_id for copy in copies}
        found = [c for c in self._candidates(None) if c.model_id in ids and c.queued == 0]
        return found if len(found) == len(ids) else None

    def held_bytes(self, unloading: bool) -> int:
        """Bytes every copy holds now (promised victims and a rollout's old copy included), with or
        without the copies being unloaded: the hard budget's count."""
        return sum(copy.bytes for copy in self.all_copies() if unloading or copy.state is not CopyState.UNLOADING)

    def evictable(self, bytes_needed: int, exclude: str, priority: int | None = None) -> list[Candidate] | None:
        """Copies to unload first so that `bytes_needed` more bytes are free, in the cost model's
        order, of at most `priority`; None when the evictable copies cannot free that much."""
        return choose_victims(self.policy, self._candidates(exclude), bytes_needed, 0, priority)

    def higher_priority(self, priority: int) -> list[str]:
        """Models whose copies here a load of `priority` may not evict (what a refusal names)."""
        return sorted(key for key, copy in self.copies.items()
                      if copy.spec.priority > priority and copy.state is not CopyState.UNLOADING)

    def _candidates(self, exclude: str | None) -> list[Candidate]:
        """Copies that may be evicted now: ready, not promised to a load, not rolling, not pinned."""
        now = self._now()
        return [
            self.candidate(copy, now) for key, copy in self.copies.items()
            if copy.state is CopyState.READY and copy.promised_to is None and copy.replacement is None
            and key != exclude and not self.is_pinned(key)
        ]

    def pinned_copies(self) -> list[Copy]:
        return [copy for key, copy in self.copies.items() if self.is_pinned(key) and copy.counts_towards_budget]

    def loading_ids(self) -> list[str]:
        return sorted(key for key, copy in self.copies.items() if copy.state is CopyState.LOADING)

    def backing_off(self, model_id: str, backoff_s: float) -> tuple[Failure, float] | None:
        """The failure a load of `model_id` must answer again now, and the seconds left of its back-off."""
        failure = self.failures.get(model_id)
        if failure is None or not failure.backs_off():
            return None
        remaining = failure.at + backoff_s - self._now()
        return (failure, remaining) if remaining > 0 else None

    # ----- state changes -----------------------------------------------------

    def _changed(self, *model_ids: str) -> None:
        """The one hook of every state change: counted, and the models it touched noted for /status."""
        self._changes += 1
        self.feed.touch_all(model_ids)

    def _new_copy(self, **fields: object) -> Copy:
        copy = Copy(**fields)  # type: ignore[arg-type]
        object.__setattr__(copy, "_feed", self.feed)
        return copy

    def promise(self, victims: Iterable[Candidate], to: str) -> None:
        """Reserve `victims` as the room of `to`'s load: they keep serving, no other load takes them."""
        for victim in victims:
            self.copies[victim.model_id].promised_to = to

    def release_promises(self, model_id: str) -> None:
        for other in self.copies.values():
            if other.promised_to == model_id:
                other.promised_to = None

    def start_load(self, spec: ModelSpec, estimate: int, victims: list[Candidate],
                   loading: "asyncio.Future[None]") -> Copy:
        """A new LOADING copy of `spec`, counted at `estimate` bytes, with `victims` promised to it."""
        assert spec.id not in self.copies, f"{spec.id} already has a copy"
        self.promise(victims, spec.id)
        copy = self.copies[spec.id] = self._new_copy(spec=spec, state=CopyState.LOADING, bytes=estimate,
                                                     loading=loading)
        self._changed(spec.id)
        return copy

    def start_rollout(self, old: Copy, spec: ModelSpec, estimate: int, loading: "asyncio.Future[None]") -> Copy:
        """A LOADING copy of `spec`'s new version beside the READY `old` one, which keeps serving
        and keeps counting: both hold memory until the new one takes over (the room was made first)."""
        new = self._new_copy(spec=spec, state=CopyState.LOADING, bytes=estimate, kept=True, replaces=old,
                             loading=loading)
        old.replacement = new
        self._changed(spec.id)
        return new

    def record_load(self, copy: Copy, size: int, seconds: float | None) -> None:
        """A load finished and measured `size`; `seconds`: its duration (None when it imported code)."""
        stats = self.stats_of(copy.model_id)
        stats.measured_bytes = size
        if seconds is not None:
            stats.load_seconds = seconds
        copy.bytes = size

    def finish_load(self, copy: Copy, worker: FrameworkWorker, now: float) -> None:
        """LOADING -> READY (a rollout's copy takes over from the old one first)."""
        if copy.replaces is not None:
            self.take_over(copy)
        copy.worker, copy.state, copy.loaded_at, copy.last_used = worker, CopyState.READY, now, now
        self.failures.pop(copy.model_id, None)
        self._changed(copy.model_id)

    def take_over(self, new: Copy) -> Copy:
        """A rollout's new copy replaces the old one in the table; the old one (returned) must drain."""
        old = new.replaces
        assert old is not None
        old.replacement = None
        new.replaces = None
        if self.copies.get(new.model_id) is old:
            self.leaving.add(old)  # still holds its memory until its requests are done
        self.copies[new.model_id] = new
        self._changed(new.model_id)
        return old

    def fail_load(self, copy: Copy, error: errors.HotsetError, now: float) -> None:
        """A LOADING copy's load failed: it goes, its promises are released, the failure is remembered."""
        if self.copies.get(copy.model_id) is copy:
            del self.copies[copy.model_id]
        self.release_promises(copy.model_id)
        self.failures[copy.model_id] = Failure(error, now, copy.spec.load_key())
        if copy.replaces is not None:  # a rollout: the old copy keeps serving, and says why
            copy.replaces.replacement = None
            copy.replaces.rollout_error = f"rollout to version {copy.spec.version} failed: {error.message}"
            copy.replaces = None
        self._changed(copy.model_id)

    def cancel_rollout(self, old: Copy) -> None:
        old.promised_to = None

    def start_unload(self, copy: Copy, gone: "asyncio.Future[None]") -> None:
        """READY -> UNLOADING: it takes no new requests; its bytes count until finish_unload."""
        copy.state = CopyState.UNLOADING
        copy.promised_to = None
        copy.gone = gone
        self._changed(copy.model_id)

    def finish_unload(self, copy: Copy) -> None:
        """An UNLOADING copy's unload ran: it holds nothing any more."""
        copy.worker = None
        self.leaving.discard(copy)
        if self.copies.get(copy.model_id) is copy:
            del self.copies[copy.model_id]
        self._changed(copy.model_id)

    def forget_failure(self, model_id: str) -> None:
        if self.failures.pop(model_id, None) is not None:
            self._changed(model_id)

    def hold(self, copy: Copy, now: float) -> None:
        """A request starts using a READY copy."""
        copy.last_used = now
        copy.inflight += 1
        copy.drained.clear()

    def release(self, copy: Copy) -> bool:
        """A request is done with its copy; True when the copy is idle now."""
        copy.inflight -= 1
        if copy.inflight == 0:
            copy.drained.set()
            return True
        return False

    def clear(self) -> None:
        gone = list(self.copies)
        self.copies.clear()
        self.leaving.clear()
        self._changed(*gone)

    # ----- invariants --------------------------------------------------------

    def problems(self) -> list[str]:
        """Every broken invariant, in words; empty when the table is consistent."""
        found: list[str] = []
        for key, copy in self.copies.items():
            found += _problems_of(copy, key)
            if copy.replaces is not None:
                found.append(f"{key}: a copy in the table still names the copy it replaces")
            if copy.replacement is not None:
                new = copy.replacement
                found += _problems_of(new, key)
                if copy.state is not CopyState.READY:
                    found.append(f"{key}: a {copy.state.value} copy has a rollout in progress")
                if new.state is not CopyState.LOADING or new.replaces is not copy:
                    found.append(f"{key}: its rollout's copy is {new.state.value} or names another copy")
            if copy.promised_to is not None:
                target = self.copies.get(copy.promised_to)
                rollout = target.replacement if target is not None else None
                if copy.state is not CopyState.READY:
                    found.append(f"{key}: a {copy.state.value} copy is promised to {copy.promised_to}")
                elif not ((target is not None and target.state is CopyState.LOADING)
                          or (rollout is not None and rollout.state is CopyState.LOADING)):
                    found.append(f"{key}: promised to {copy.promised_to}, which is not loading")
        for copy in self.leaving:
            found += _problems_of(copy, copy.model_id)
            if copy.state is not CopyState.UNLOADING:
                found.append(f"{copy.model_id}: a replaced copy still draining is {copy.state.value}")
            if self.copies.get(copy.model_id) is copy:
                found.append(f"{copy.model_id}: a replaced copy is still the table's")
        if self.max_models is not None:
            # READY copies that stay (not promised to a load, not transient): within the limit.
            settled = [c for c in self.copies.values()
                       if c.state is CopyState.READY and c.promised_to is None and not c.transient]
            if len(settled) > self.max_models:
                found.append(f"{len(settled)} ready copies nothing is replacing, more than the limit of {self.max_models}")
        for key, failure in self.failures.items():
            if not isinstance(failure.error, errors.HotsetError):
                found.append(f"{key}: a remembered failure is no HotsetError")
        return found

    def check(self) -> None:
        """Raise TableInvariantBroken naming every broken invariant (tests call it after each step)."""
        found = self.problems()
        if found:
            raise TableInvariantBroken("; ".join(found))


def _problems_of(copy: Copy, key: str) -> list[str]:
    found = []
    if copy.model_id != key:
        found.append(f"{key}: holds a copy of {copy.model_id}")
    if copy.inflight < 0 or copy.queued < 0:
        found.append(f"{key}: negative count (inflight {copy.inflight}, queued {copy.queued})")
    if copy.drained.is_set() != (copy.inflight == 0):
        found.append(f"{key}: drained is {copy.drained.is_set()} with {copy.inflight} in flight")
    if copy.bytes < 0:
        found.append(f"{key}: negative size")
    if copy.state is CopyState.READY and copy.worker is None:
        found.append(f"{key}: READY without a worker")
    if copy.state is CopyState.LOADING and (copy.worker is not None or copy.loading.done()):
        found.append(f"{key}: LOADING with a worker or a finished load")
    if copy.state is CopyState.LOADING and copy.inflight:
        found.append(f"{key}: requests in flight on a copy still loading")
    if copy.state is CopyState.UNLOADING and copy.gone is None:
        found.append(f"{key}: UNLOADING with nothing to wait for")
    return found
