"""What keeps a flood of requests from exhausting the router, one guard for every inference route.

The seed API (``/predict``), OIP v2 (``/v2/models/{name}/infer``, and
ModelInfer over gRPC), and the OpenAI routes (``/v1/completions``,
``/v1/chat/completions``, ``/v1/embeddings``) share one ``FloodGuard``, so a flood on one protocol
counts against the same bounds as the others (the OpenAI routes once had
none: a client could hold any number of 64 MiB bodies). The bounds:

- at most ``max_requests`` inference requests served at once, streams
  included (a stream counts until it ends). A request takes its slot when
  its body has arrived, not before: a client trickling its body holds no
  slot, only a connection and its body's deadline (slow_clients.py), so a
  thousand of them cannot take the slots of clients that send at once.
  A request that arrives while every slot is taken is refused before its
  body is read;
- at most ``max_body_bytes_in_flight`` bytes of request bodies held in
  memory. A request past either bound is refused at once (503 with
  Retry-After) before its body is read, or as soon as a body without a
  Content-Length grows past it. One body alone is bounded by
  ``max_body_bytes`` (413);
- at most ``max_cold_waiters`` requests per model waiting for a model that
  has no ready copy yet; the wait ends when the request's worker answers
  (or its stream opens);
- per namespace, its weighted share of the slots, work-conserving
  (``hotset_common.shares``): a namespace takes a free slot while it holds
  less than its share, ``(max_requests - R - U) x w / W``, where w is its
  ModelQuota's ``servingWeight``, W the weights of the namespaces holding
  slots now (its own included), R a small reserve (1/32 of the slots, at
  least one) for a namespace not yet served and U the slots of requests
  with no namespace or whose model is not known yet; past its share, it takes one only while
  at least R slots stay free besides what the other namespaces holding
  slots are still owed under their shares. So a namespace alone may hold
  all but R slots (idle slots are never refused: the old rule,
  ``max_requests x w / (W + 1)``, left half of them idle), and when a
  second namespace arrives it gets the R at once and every slot the first
  gives back until it holds its share, while the first is refused (503,
  Retry-After, naming its share). Slots are never taken back: a request
  runs to its end. A model without a namespace (the local stack, a
  standalone router) is not counted in any share, only in the slots.

Why refuse at once instead of queueing: these bounds protect the router's
own memory and event loop, and a request held here would still hold its
body. Waiting for room on a worker, a load or a starting pod happens
further on, within the request's deadline.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable, Mapping

from hotset_common import errors
from hotset_common.shares import over_share
from hotset_common.spec import DEFAULT_SERVING_WEIGHT

Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much inference traffic the router holds at once (see the module docstring)."""

    max_body_bytes: int = 64 * 2**20
    max_requests: int = 1024
    max_body_bytes_in_flight: int = 512 * 2**20
    max_cold_waiters: int = 256


@dataclasses.dataclass
class Ticket:
    """One admitted request: the body bytes it holds in the budget, and the model it waits for cold."""

    reserved_bytes: int
    cold_model: str | None = None
    serving: bool = False  # holds a slot: its body has arrived
    namespace: str | None = None  # counted in this namespace's share of the slots


class FloodGuard:
    """Counts inference requests in and out against `limits`; refuses what would pass them."""

    def __init__(self, limits: Limits, has_ready_copy: Callable[[str], bool], retry_after_s: int,
                 namespace_of: Callable[[str], str | None] = lambda model: None,
                 weight_of: Callable[[str], float] = lambda namespace: DEFAULT_SERVING_WEIGHT) -> None:
        self.limits = limits
        self.has_ready_copy = has_ready_copy
        self.retry_after_s = retry_after_s
        self.namespace_of = namespace_of  # the namespace of a model's ServedModel (discovery)
        self.weight_of = weight_of  # a namespace's servingWeight (its ModelQuota)
        self.held: dict[str, int] = {}  # namespace -> slots its requests hold now
        self.requests = 0
        self.body_bytes = 0  # declared (or, when undeclared, arrived) bytes of the bodies held now
        self.cold_waiters: dict[str, int] = {}  # model -> requests waiting while it has no ready copy

    def admit(self, headers: Mapping[str, str]) -> Ticket:
        """Let the request send its body, or refuse it (503, Retry-After) before its body is read: every
        slot is taken, or its body would pass the budget. It reserves its Content-Length, or nothing yet
        when it declares none (read_body reserves what arrives); its slot is taken when its body is in."""
        declared = headers.get("content-length", "")
        reserve = min(int(declared), self.limits.max_body_bytes) if declared.isdigit() else 0
        self._check_slots()
        self._reserve(reserve, 0)
        return Ticket(reserve)

    def admit_whole(self, size: int) -> Ticket:
        """A request whose body arrived whole before the router saw it (gRPC reads a message before
        its handler runs, bounded by max_body_bytes): refused (503) past either bound, else it holds
        its bytes and a slot until released."""
        self._check_slots()
        self._reserve(size, 0)
        self.requests += 1
        return Ticket(size, serving=True)

    def _check_slots(self) -> None:
        if self.requests >= self.limits.max_requests:
            raise errors.NoCapacity(f"the router is serving {self.requests} requests, its limit; retry shortly", 1)

    async def read_body(self, ticket: Ticket, receive: Receive, headers: Mapping[str, str]) -> bytes:
        """The whole body, refused (413) past max_body_bytes, or (503) once it grows past its
        reservation while the budget is spent."""
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise errors.PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise errors.BadInput("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise errors.PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            if size > ticket.reserved_bytes:
                self._reserve(size - ticket.reserved_bytes, ticket.reserved_bytes)
                ticket.reserved_bytes = size
            chunks.append(chunk)
            if not message.get("more_body", False):
                self._check_slots()  # bodies that arrived meanwhile may have taken the last slots
                self.requests += 1
                ticket.serving = True
                return b"".join(chunks)

    def for_model(self, ticket: Ticket, model: str) -> None:
        """Once a request's model is known: its namespace's share of the slots, then the count of
        the requests waiting for the model when it has no ready copy."""
        self._claim_share(ticket, model)
        self.wait_cold(ticket, model)

    def _claim_share(self, ticket: Ticket, model: str) -> None:
        namespace = self.namespace_of(model) if ticket.serving and ticket.namespace is None else None
        if not namespace:
            return
        # this request's slot is counted in self.requests already (read_body, admit_whole)
        over = over_share(self.limits.max_requests, self.requests - 1, namespace, self.held, self.weight_of)
        if over is not None:
            slots = f"the router's {self.limits.max_requests} request slots"
            raise errors.NoCapacity(f"{over.describe(slots)}; retry shortly", self.retry_after_s)
        held = self.held.get(namespace, 0)
        self.held[namespace] = held + 1
        ticket.namespace = namespace

    def wait_cold(self, ticket: Ticket, model: str) -> None:
        """Count a request for a model with no ready copy, or refuse it when too many already wait."""
        if self.has_ready_copy(model):
            return
        waiting = self.cold_waiters.get(model, 0)
        if waiting >= self.limits.max_cold_waiters:
            raise errors.NoCapacity(
                f"model {model!r} has no ready copy yet and {waiting} requests already wait for it; retry shortly",
                self.retry_after_s)
        self.cold_waiters[model] = waiting + 1
        ticket.cold_model = model

    def done_waiting(self, ticket: Ticket) -> None:
        """The request's worker answered (or its stream opened): it no longer waits for a cold model."""
        model, ticket.cold_model = ticket.cold_model, None
        if model is None:
            return
        left = self.cold_waiters.get(model, 1) - 1
        if left <= 0:
            self.cold_waiters.pop(model, None)
        else:
            self.cold_waiters[model] = left

    def release(self, ticket: Ticket) -> None:
        """The request is over: its slot and its body's bytes go back."""
        self.done_waiting(ticket)
        if ticket.namespace is not None:
            left = self.held.get(ticket.namespace, 1) - 1
            if left <= 0:
                self.held.pop(ticket.namespace, None)
            else:
                self.held[ticket.namespace] = left
            ticket.namespace = None
        if ticket.serving:
            self.requests -= 1
            ticket.serving = False
        self.body_bytes -= ticket.reserved_bytes
        ticket.reserved_bytes = 0

    def _reserve(self, more: int, own: int) -> None:
        """Add `more` bytes to a request holding `own`; refused when that passes the budget while
        other requests hold bodies too (one body alone is bounded by max_body_bytes)."""
        if more > 0 and self.body_bytes + more > self.limits.max_body_bytes_in_flight and self.body_bytes > own:
            raise errors.NoCapacity(
                f"the router holds {self.body_bytes} bytes of request bodies and this one would pass its limit of "
                f"{self.limits.max_body_bytes_in_flight}; retry shortly", 1)
        self.body_bytes += more
