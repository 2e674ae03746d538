"""Prefix-aware choice among a model's ready copies: the same prompt prefix to the same copy, while it has room.

An LLM engine with prefix caching (vLLM's automatic prefix caching) keeps
the attention state of prompts it has seen; a request whose prompt starts
the same way (a shared system prompt, a few-shot preamble, the earlier turns
of a conversation) skips recomputing that part, but only on the copy that
holds it. Power of two choices would scatter such requests over every copy.

The choice is consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, 2018): copies are ranked by a rendezvous hash of (prefix,
copy), and the request goes to the first one in that order that has room.
A copy has room while its in-flight requests (this one included) stay
within ``load_factor`` times the average, or within ``min_room``: an engine
that batches continuously serves a few requests at once at little cost, so
at low load a prefix stays on its copy instead of spreading. So a prefix
sticks to one copy while that copy is not much busier than the others, and
spills to its next choice (the same next choice for every request of that
prefix) when it is. The function is pure and deterministic: two routers with
the same counts choose the same copy.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Sequence

DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_MIN_ROOM = 8  # requests at once a copy always has room for


def score(prefix: str, copy: str) -> int:
    """Rendezvous weight of `copy` for `prefix` (higher first)."""
    digest = hashlib.blake2b(f"{prefix}\x00{copy}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(prefix: str, copies: Sequence[str]) -> list[str]:
    """`copies` in the order this prefix prefers them."""
    return sorted(copies, key=lambda copy: (score(prefix, copy), copy), reverse=True)


def choose(prefix: str, copies: Sequence[str], inflight: Callable[[str], int],
           load_factor: float = DEFAULT_LOAD_FACTOR, min_room: int = DEFAULT_MIN_ROOM) -> str:
    """The copy for a request whose prompt starts with `prefix`: its first preference with room."""
    if len(copies) == 1:
        return copies[0]
    loads = {copy: inflight(copy) for copy in copies}
    bound = max(min_room, math.ceil(load_factor * (sum(loads.values()) + 1) / len(copies)))
    for copy in ranked(prefix, copies):
        if loads[copy] + 1 <= bound:
            return copy
    return min(copies, key=lambda copy: (loads[copy], copy))  # not reached: some copy is at most average
