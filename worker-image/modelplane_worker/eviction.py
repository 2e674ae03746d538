"""Which loaded models to give up when a new one needs room.

The manager decides *when* to evict and never *which*: it hands the policy
the evictable copies (pinned and already-leaving ones filtered out) and takes
victims from the front of the order the policy returns. Time is passed in, so
a policy is a pure function of its input and tests need no sleeps.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Candidate:
    """One loaded model as the policy sees it."""

    model_id: str
    bytes: int
    last_used: float  # clock time of the last request (or of the load)
    loaded_at: float  # clock time the load finished
    inflight: int = 0


class EvictionPolicy(abc.ABC):
    @abc.abstractmethod
    def order(self, candidates: Sequence[Candidate], now: float) -> list[Candidate]:
        """Candidates in the order they should be evicted, first victim first."""


class LRUPolicy(EvictionPolicy):
    """Least recently used first, with a churn guard.

    A model loaded less than `min_residency_s` ago goes only after every older
    one: evicting what was just paid for to load is the worst trade. Models
    serving requests right now go after idle ones (they are not unloaded under
    a request either way: the manager waits for them to drain).
    """

    def __init__(self, min_residency_s: float = 10.0) -> None:
        self.min_residency_s = min_residency_s

    def order(self, candidates: Sequence[Candidate], now: float) -> list[Candidate]:
        def key(candidate: Candidate) -> tuple[bool, bool, float]:
            just_loaded = now - candidate.loaded_at < self.min_residency_s
            return (just_loaded, candidate.inflight > 0, candidate.last_used)

        return sorted(candidates, key=key)


def choose_victims(
    policy: EvictionPolicy,
    candidates: Sequence[Candidate],
    now: float,
    bytes_needed: int,
    slots_needed: int = 0,
) -> list[Candidate] | None:
    """The shortest prefix of the policy's order that frees enough; None when all of them would not."""
    if bytes_needed <= 0 and slots_needed <= 0:
        return []
    victims: list[Candidate] = []
    freed = 0
    for candidate in policy.order(candidates, now):
        victims.append(candidate)
        freed += candidate.bytes
        if freed >= bytes_needed and len(victims) >= slots_needed:
            return victims
    return None
