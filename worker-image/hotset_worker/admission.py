"""The admission queue: requests whose model has no copy and no room yet, shared fairly between
namespaces.

Requests for the same model share one place (a ``Ticket``): when room frees
up, the model at the head is loaded once for all of them. The queue is
bounded in requests; a full queue is the manager's cue to refuse at once
(503 with Retry-After). Synchronous, like the copy table: the manager awaits
a ticket's ``admitted`` future with its deadline on the injected clock.

Which ticket is the head, in this order:

1. **Priority** (``ModelSpec.priority``): higher first, across namespaces
   (each namespace's ModelQuota caps what its models may claim).
2. **Namespaces by fair share** among tickets of that priority: start-time fair
   queueing over loads, as the inference threads do over passes
   (fair_threads.py). A namespace's next load starts at the later of the
   queue's virtual time and its previous load's finish tag, and finishes
   ``1 / weight`` later; the smallest start goes first. So a namespace that
   thrashes a hundred cold models does not put another namespace's one cold
   model behind all of them: a newcomer's load is the next but one at most.
3. **Within a namespace**: realtime models first (``LatencyClass``: their
   callers wait in a request path), then first come first served.

And places: a namespace takes its weighted share of the queue's requests,
work-conserving (``hotset_common.shares``, the rule the router's request
slots use): alone it may hold all but a small reserve of the places, and
past its share it joins only while the places the other waiting namespaces
are still owed (and the reserve, for a namespace not yet waiting) stay
free. So one namespace's flood of cold requests is refused (503) once
others wait, while they still queue and get the places it gives back.
Models with no namespace (a local store) are one group, never limited.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from hotset_common import errors
from hotset_common.shares import over_share
from hotset_common.spec import DEFAULT_SERVING_WEIGHT, LatencyClass, ModelSpec
from hotset_worker.copy_table import Copy


@dataclass(eq=False)
class Ticket:
    """One model's place in the queue, shared by every request waiting for it."""

    spec: ModelSpec
    admitted: "asyncio.Future[Copy]"  # resolved with the copy whose load was started for it
    waiters: int = 0
    since: float = 0.0  # the clock's reading when its first request joined


class AdmissionQueue:
    def __init__(self, max_requests: int,
                 weight_of: Callable[[str], float] = lambda namespace: DEFAULT_SERVING_WEIGHT) -> None:
        if max_requests < 0:
            raise ValueError(f"admission queue size must not be negative, got {max_requests}")
        self.max_requests = max_requests
        self.weight_of = weight_of  # a namespace's servingWeight (the worker learns it with each request)
        self.tickets: dict[str, Ticket] = {}  # insertion order is arrival order
        self.requests = 0
        self._ranked = 0  # tickets of realtime models or of a priority other than 0
        self._waiting: dict[str, int] = {}  # namespace -> its requests in the queue
        self._finish: dict[str, float] = {}  # namespace -> finish tag of its last admitted load
        self._virtual = 0.0  # the start tag of the load admitted last

    def __bool__(self) -> bool:
        return bool(self.tickets)

    def is_full(self) -> bool:
        return self.requests >= self.max_requests

    def over_share(self, spec: ModelSpec) -> str | None:
        """Why a request for `spec` may not join because its namespace holds its share of the
        places and the free ones are kept for the others'; None when it may. Called after
        `is_full` (the total bound has its own refusal)."""
        namespace = spec.namespace
        if not namespace:
            return None
        over = over_share(self.max_requests, self.requests, namespace, self._waiting, self.weight_of)
        return None if over is None else over.describe(f"the admission queue's {self.max_requests} places")

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
        self._count(spec.namespace, +1)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """A request stopped waiting (admitted, refused or gone); its place goes when nobody waits."""
        ticket.waiters -= 1
        self.requests -= 1
        self._count(ticket.spec.namespace, -1)
        if ticket.waiters == 0 and self.tickets.get(ticket.spec.id) is ticket:
            self._remove(ticket)  # nobody waits any more: its load is not started

    def head(self) -> Ticket | None:
        """The ticket admitted next (the module docstring's order). O(1) while the queue holds one
        namespace's unranked tickets; else a scan of the tickets (the queue is bounded)."""
        if not self._ranked and len(self._waiting) <= 1:
            return next(iter(self.tickets.values()), None)
        if not self.tickets:
            return None
        top = max(ticket.spec.priority for ticket in self.tickets.values())
        first: dict[str, Ticket] = {}  # namespace -> its head among tickets of the top priority
        for ticket in self.tickets.values():
            if ticket.spec.priority != top:
                continue
            held = first.get(ticket.spec.namespace)
            if held is None or _rank(ticket) > _rank(held):  # equals keep the first (oldest)
                first[ticket.spec.namespace] = ticket
        return min(first.values(), key=lambda ticket: self._start_of(ticket.spec.namespace))  # min keeps the first

    def admit(self, ticket: Ticket, copy: Copy) -> None:
        """The head's load started (or its copy exists): its requests go to `copy`."""
        self._remove(ticket)
        self.charge(ticket.spec.namespace)
        copy.queued += ticket.waiters
        ticket.admitted.set_result(copy)

    def charge(self, namespace: str) -> None:
        """A load of `namespace` starts: the queue's head, or a load the manager started at once
        (nothing waited): its share is spent as if it had queued."""
        start = self._start_of(namespace)
        self._virtual = start
        self._finish[namespace] = start + 1.0 / max(self.weight_of(namespace), 1e-6)

    def refuse(self, ticket: Ticket, error: errors.HotsetError) -> None:
        """The head can never be admitted as things are (a load that backs off, a model too large)."""
        self._remove(ticket)
        _fail(ticket.admitted, error)

    def _start_of(self, namespace: str) -> float:
        return max(self._virtual, self._finish.get(namespace, 0.0))

    def _count(self, namespace: str, change: int) -> None:
        left = self._waiting.get(namespace, 0) + change
        if left > 0:
            self._waiting[namespace] = left
        else:
            self._waiting.pop(namespace, None)
            if self._finish.get(namespace, 0.0) <= self._virtual:
                self._finish.pop(namespace, None)  # it would start at the virtual time anyway

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
