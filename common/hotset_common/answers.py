"""Answers of slow questions (an API server's reviews), kept for a while and asked once at a time.

The router's caller checks (TokenReview, SubjectAccessReview), its and the operator's reviews of
the worker pods' identity tokens (worker_identity.py) and the operator's of catalog readers all
ask the API server questions whose answers hold for a while: each is asked once, by whoever asks
first, and kept, so the hot path makes no API call.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class Answers(Generic[Key, Value]):
    """Reviews' answers for a while: truthy ones `ttl_s`, falsy ones `refused_ttl_s` (a grant made
    just now works soon), at most `max_entries` (the oldest go first). A key asked again while its
    review runs waits for that review; a review that failed is not kept. `lifetime(value)`, when
    given, may shorten a truthy answer's time (a token's own expiry, seconds from now)."""

    def __init__(self, ttl_s: float, refused_ttl_s: float, max_entries: int, clock: Callable[[], float],
                 lifetime: Callable[[Value], float | None] | None = None) -> None:
        self.ttl_s = ttl_s
        self.refused_ttl_s = refused_ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lifetime = lifetime
        self._entries: OrderedDict[Key, tuple[float, Value]] = OrderedDict()
        self._pending: dict[Key, asyncio.Future[Value]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: Key, review: Callable[[], Awaitable[Value]]) -> Value:
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(review())
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(pending)  # a waiter that leaves does not cancel the others' review

    def _settle(self, key: Key, done: asyncio.Future[Value]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        value = done.result()
        keep = self.ttl_s if value else self.refused_ttl_s
        if value and self._lifetime is not None and (left := self._lifetime(value)) is not None:
            keep = min(keep, left)
        self._entries[key] = (self._clock() + keep, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
