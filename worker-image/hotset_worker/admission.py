"""The admission queue: requests whose model has no copy and no room yet, first come first served,
higher priorities first (``ModelSpec.priority``), and among equals realtime models first
(``LatencyClass``: their callers are waiting in a request path).

Requests for the same model share one place (a ``Ticket``): when room frees
up, the model at the head is loaded once for all of them. The queue is
bounded in requests; a full queue is the manager's cue to refuse at once
(503 with Retry-After). Synchronous, like the copy table: the manager awaits
a ticket's ``admitted`` future with its deadline on the injected clock.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hotset_common import errors
from hotset_common.spec import LatencyClass, ModelSpec
from hotset_worker.copy_table import Copy


@dataclass(eq=False)
class Ticket:
    """One model's place in the queue, shared by every request waiting for it."""

    spec: ModelSpec
    admitted: "asyncio.Future[Copy]"  # resolved with the copy whose load was started for it
    waiters: int = 0
    since: float = 0.0  # the clock's reading when its first request joined


class AdmissionQueue:
    def __init__(self, max_requests: int) -> None:
        if max_requests < 0:
            raise ValueError(f"admission queue size must not be negative, got {max_requests}")
        self.max_requests = max_requests
        self.tickets: dict[str, Ticket] = {}  # insertion order is arrival order
        self.requests = 0
        self._ranked = 0  # tickets of realtime models or of a priority other than 0 (none: the head is the oldest)

    def __bool__(self) -> bool:
        return bool(self.tickets)

    def is_full(self) -> bool:
        return self.requests >= self.max_requests

    def get(self, model_id: str) -> Ticket | None:
        return self.tickets.get(model_id)

    def join(self, spec: ModelSpec, now: float) -> Ticket:
        """One more request waits for `spec` (a new ticket at the back, or the model's place)."""
        ticket = self.tickets.get(spec.id)
        if ticket is None:
            ticket = self.tickets[spec.id] = Ticket(spec, asyncio.get_running_loop().create_future(), since=now)
            self._ranked += _is_ranked(ticket)
        ticket.waiters += 1
        self.requests += 1
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """A request stopped waiting (admitted, refused or gone); its place goes when nobody waits."""
        ticket.waiters -= 1
        self.requests -= 1
        if ticket.waiters == 0 and self.tickets.get(ticket.spec.id) is ticket:
            self._remove(ticket)  # nobody waits any more: its load is not started

    def head(self) -> Ticket | None:
        """The ticket admitted next: the oldest of the highest priority, realtime before others of
        the same priority. A scan only while some ticket is ranked (the queue is bounded)."""
        if self._ranked:
            return max(self.tickets.values(), key=_rank)  # max keeps the first (oldest) of equals
        return next(iter(self.tickets.values()), None)

    def admit(self, ticket: Ticket, copy: Copy) -> None:
        """The head's load started (or its copy exists): its requests go to `copy`."""
        self._remove(ticket)
        copy.queued += ticket.waiters
        ticket.admitted.set_result(copy)

    def refuse(self, ticket: Ticket, error: errors.HotsetError) -> None:
        """The head can never be admitted as things are (a load that backs off, a model too large)."""
        self._remove(ticket)
        _fail(ticket.admitted, error)

    def _remove(self, ticket: Ticket) -> None:
        del self.tickets[ticket.spec.id]
        self._ranked -= _is_ranked(ticket)

    def waiting(self, now: float) -> list[tuple[str, int, float]]:
        """(model, requests, seconds its first request has waited), in arrival order."""
        return [(key, ticket.waiters, max(0.0, now - ticket.since)) for key, ticket in self.tickets.items()]

    def close(self, error: errors.HotsetError) -> None:
        for ticket in self.tickets.values():
            if not ticket.admitted.done():
                _fail(ticket.admitted, error)
        self.tickets.clear()
        self._ranked = 0


def _rank(ticket: Ticket) -> tuple[int, bool]:
    return ticket.spec.priority, ticket.spec.latency_class is LatencyClass.REALTIME


def _is_ranked(ticket: Ticket) -> bool:
    return _rank(ticket) != (0, False)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    future.set_exception(error)
    future.add_done_callback(lambda done: done.exception())  # retrieved, even with no waiter
