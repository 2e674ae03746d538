"""Sending a request to the copy its target choice names, within its deadline, retrying once elsewhere.

- A connection failure or 5xx is retried once on another target; the pod
  leaves the map (connection failure: it is asked for its status at once)
  or the copy is skipped until the worker's next report (5xx). A worker's
  4xx goes back to the client as is.
- With no ready copy the request itself goes to the pod where its model is
  loading or where placement puts it: the worker loads the model for it
  and serves it as soon as it is ready (one load however many requests join).
- Every attempt tells the worker the time left (``X-Hotset-Timeout``) and
  counts in the copy's in-flight requests while it lasts.
- With no ready pod able to serve the model (pods starting, or scaled to
  zero), the request first waits (within its deadline) while one starts
  (pod_waiter.py); an answer that waited names the wait in its
  Server-Timing (``wire.POD_WAIT_TIMING``).
- OIP v2 over gRPC (grpc_gateway.py) takes the same path as HTTP
  (``forward_with``): only the attempt at a pod differs (grpc_upstream.py).
- Streams (the OpenAI routes) take the same path and return as soon as the
  answer starts; the copy counts the request until the caller closes it.
- Before anything else, the caller is checked (callers.py), then its
  namespace's request rate (rates.py), then its namespace's share of the
  router's request slots (the caller's ``on_admitted``: flood.py): a request
  refused by any of them loads, places and wakes nothing, and one refused for
  its caller never counts against the namespace it named.
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping, Protocol, TypeVar

from hotset_common import errors, wire
from hotset_common.spec import DEFAULT_SERVING_WEIGHT
from hotset_common.wire import SHARE_WEIGHT_HEADER, TIMEOUT_HEADER, share_weight
from hotset_router.callers import ANONYMOUS, Callers
from hotset_router.rates import NO_RATES, NamespaceRates
from hotset_router.deadlines import Deadlines
from hotset_router.model_map import ModelMap
from hotset_router.pod_waiter import PodWaiter
from hotset_router.status_sync import StatusSync
from hotset_router.targets import Targets
from hotset_router.telemetry import RouterMetrics
from hotset_router.upstream import PodUnreachable, UpstreamResponse, UpstreamStream, WorkerClient

log = logging.getLogger("hotset_router.routing")

Answer = TypeVar("Answer", bound="Reply")  # what one attempt at a pod returns (whole or streamed)
Whole = TypeVar("Whole", bound="Reply")  # a whole answer in one wire format (HTTP, gRPC)


class Reply(Protocol):
    """What routing reads of any pod's answer: its status as HTTP's (5xx: try elsewhere), its headers."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def with_headers(self, headers: Mapping[str, str]) -> Any: ...


# One attempt at a pod: (its url, the headers to send, the time it has) -> its answer; PodUnreachable
# when it did not answer at all.
Send = Callable[[str, Mapping[str, str], float], Awaitable[Whole]]
# What a request must still pass once its caller and rate are checked (the flood guard's
# namespace share: flood.FloodGuard.for_model); it raises to refuse.
OnAdmitted = Callable[[], None]


def nothing_more() -> None:
    """The OnAdmitted of a request with nothing more to pass (metadata, the router's own calls)."""


class Forwarder:
    def __init__(self, model_map: ModelMap, client: Callable[[], WorkerClient], sync: StatusSync, targets: Targets,
                 metrics: RouterMetrics, deadlines: Deadlines, retry_after_s: int) -> None:
        self.model_map = model_map
        self._client = client  # the router's current client (tests replace it on the router)
        self.sync = sync
        self.targets = targets
        self.metrics = metrics
        self.deadlines = deadlines
        self.retry_after_s = retry_after_s
        self.pod_waiter: PodWaiter | None = None  # cluster mode: hold a request while a pod of its model starts
        self.callers: Callers = ANONYMOUS  # who may send what (the service sets the router's)
        self.rates: NamespaceRates = NO_RATES  # each namespace's request rate (its ModelQuota)
        self.weight_of: Callable[[str], float] = lambda namespace: DEFAULT_SERVING_WEIGHT  # its servingWeight

    @property
    def client(self) -> WorkerClient:
        return self._client()

    async def forward(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                      load: bool = True, on_admitted: OnAdmitted = nothing_more) -> UpstreamResponse:
        """Send an HTTP request for `model` to a copy within its deadline, retrying once elsewhere on failure.
        `load=False` (metadata): never place a copy; any pod that can load the model answers from its store."""
        async def send(url: str, sent: Mapping[str, str], timeout_s: float) -> UpstreamResponse:
            return await self.client.forward(url, method, path, body, sent, timeout_s=timeout_s)

        return await self.forward_with(model, headers, send, load, versioned="/versions/" in path,
                                       on_admitted=on_admitted)

    async def forward_with(self, model: str, headers: Mapping[str, str], send: Send[Whole], load: bool = True,
                           versioned: bool = False, on_admitted: OnAdmitted = nothing_more) -> Whole:
        """``forward`` for any wire format: `send(url, headers, timeout_s)` makes one attempt at a pod
        (HTTP, or gRPC: grpc_upstream.py) and answers with its status sorted as HTTP's, so every
        protocol gets the same targets, canary split, pod wait, retry and in-flight counts. A request
        that names a version (`versioned`) gets that version, never a canary. `on_admitted` runs once
        the caller and its rate are checked (the flood guard's namespace share: a request refused
        for its caller never counts against the namespace it named)."""
        deadline = self.deadlines.deadline(headers)
        headers = self._admitted(headers, await self.callers.check(headers, model))
        on_admitted()

        async def attempts() -> Whole:
            chosen, sent = model, headers
            if load and not versioned:
                chosen, sent = self.targets.with_variant(model, headers)

            def target(tried: list[str]) -> tuple[str, bool] | None:
                nonlocal chosen, sent
                chosen, sent = self.targets.still_chosen(model, chosen, headers, sent)
                return self.targets.target(chosen, tried, load)

            async def attempt(url: str, cold: bool) -> Whole | None:
                return await self._try(url, chosen, send, sent, deadline, cold and load)

            return await self._with_one_retry(chosen, deadline, target, attempt)

        return await self._after_pod_wait(model, deadline, attempts) if load else await attempts()

    def _admitted(self, headers: Mapping[str, str], namespace: str | None) -> Mapping[str, str]:
        """A request its caller may send: within its namespace's rate (429 past it), and carrying
        the namespace's serving weight for the worker's fair shares (wire.SHARE_WEIGHT_HEADER; a
        client's own is dropped)."""
        self.rates.take(namespace)
        if namespace:
            return {**headers, SHARE_WEIGHT_HEADER: share_weight(namespace, self.weight_of(namespace))}
        if SHARE_WEIGHT_HEADER in headers:
            return {k: v for k, v in headers.items() if k != SHARE_WEIGHT_HEADER}
        return headers

    async def open_stream(self, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                          prefix: str = "", base: str = "", on_admitted: OnAdmitted = nothing_more) -> UpstreamStream:
        """``forward`` for answers that stream: the same targets (``Targets.stream_target``), but the
        answer is returned as soon as it starts, for the caller to pass on chunk by chunk and close.
        A pod that fails, or answers 5xx, before its answer starts costs one retry elsewhere; once an
        answer streams, it is the answer. `on_admitted`: as for ``forward_with``."""
        deadline = self.deadlines.deadline(headers)
        headers = self._admitted(headers, await self.callers.check(headers, model))
        on_admitted()

        async def send() -> UpstreamStream:
            chosen, sent = self.targets.with_variant(model, headers)  # the canary split, as for whole answers

            def target(tried: list[str]) -> tuple[str, tuple[str, ...]] | None:
                nonlocal chosen, sent
                chosen, sent = self.targets.still_chosen(model, chosen, headers, sent)
                return self.targets.stream_target(chosen, tried, prefix, base)

            async def attempt(url: str, loads: tuple[str, ...]) -> UpstreamStream | None:
                return await self._open(url, chosen, method, path, body, sent, deadline, loads)

            return await self._with_one_retry(chosen, deadline, target, attempt,
                                              discard=lambda stream: stream.close())

        return await self._after_pod_wait(model, deadline, send)

    async def _with_one_retry(self, model: str, deadline: float, target: Callable[[list[str]], tuple[str, Any] | None],
                              attempt: Callable[[str, Any], Awaitable[Answer | None]],
                              discard: Callable[[Answer], None] = lambda _: None) -> Answer:
        """Try `model`'s next target (`target(tried)`: (url, what the attempt needs), None: nowhere
        left), and once more elsewhere if the pod did not answer or answered 5xx, within `deadline`.
        A 5xx with no other copy to try is the answer; an answer replaced by a later one is
        `discard`ed (a stream's is closed)."""
        tried: list[str] = []
        kept: Answer | None = None
        for number in range(2):
            found = target(tried)
            if found is None:
                break
            url, needs = found
            if number > 0:
                self.metrics.retried(model)
            answer = await attempt(url, needs)
            if answer is not None:
                if kept is not None:
                    discard(kept)
                if answer.status_code < 500:
                    return answer
                kept = answer
            tried.append(url)
            if self.deadlines.time_left(deadline) <= 0:
                break
        if kept is not None:
            return kept  # a 5xx with no other copy to try: the worker's answer stands
        raise errors.BackendUnavailable(f"no ready copy of {model!r} answered", self.retry_after_s)

    async def hold_for_pod(self, model: str, deadline: float) -> float | None:
        """With no ready pod able to serve `model`, wait (within `deadline`) while one starts
        (pod_waiter.py) and return the seconds held; None at once otherwise."""
        if self.pod_waiter is None:
            return None
        return await self.pod_waiter.wait(model, deadline)

    async def _after_pod_wait(self, model: str, deadline: float, send: Callable[[], Awaitable[Answer]]) -> Answer:
        """Hold for a pod, then `send`. The one place every inference request (seed, OIP v2, OpenAI,
        whole or streamed) may wait, so the one place its answer says so: after a hold, the answer's
        Server-Timing (or the error's) gains ``wire.POD_WAIT_TIMING`` beside the worker's entries.
        A stream's headers go out after the wait, so they carry it too."""
        held = await self.hold_for_pod(model, deadline)
        if held is None:
            return await send()
        entry = wire.POD_WAIT_TIMING.entry(held)
        try:
            answer = await send()
        except errors.HotsetError as exc:
            exc.headers = wire.with_server_timing(exc.headers, entry)
            raise
        return answer.with_headers(wire.with_server_timing(answer.headers, entry))

    async def _try(self, url: str, model: str, send: Send[Whole], headers: Mapping[str, str],
                   deadline: float, loads: bool = False) -> Whole | None:
        """One attempt within `deadline` (the worker is told the time left); None if the pod did not
        answer. `loads`: this request loads the model there."""
        self.model_map.begin_request(url, model)
        response: Whole | None = None
        left = self.deadlines.time_left(deadline)
        try:
            response = await send(url, {**headers, TIMEOUT_HEADER: f"{max(left, 0.001):.3f}"},
                                  left + 0.5)  # the worker answers its own deadline first
        except PodUnreachable as exc:
            log.warning("%s", exc)
            # A dead pod also fails its status call and leaves the map at once; a stale
            # keep-alive connection on a live pod does not cost the pod its place.
            if exc.gone:
                await self.sync.refresh(url)
            return None
        finally:
            self.model_map.end_request(url, model)
            if loads:
                if response is not None and response.status_code == 200:
                    self.model_map.record_loaded(url, model, self.model_map.estimated_bytes(model))
                else:
                    self.model_map.release_load(url, model)
        if response.status_code >= 500:
            log.warning("worker %s answered %s for %s", url, response.status_code, model)
            self.model_map.mark_copy_failed(url, model)
        return response

    async def _open(self, url: str, model: str, method: str, path: str, body: bytes, headers: Mapping[str, str],
                    deadline: float, loads: tuple[str, ...]) -> UpstreamStream | None:
        """One attempt; None if the pod did not answer. In flight on the copy until the answer is closed."""
        self.model_map.begin_request(url, model)
        left = self.deadlines.time_left(deadline)
        answer: UpstreamStream | None = None
        try:
            answer = await self.client.open(url, method, path, body, {**headers, TIMEOUT_HEADER: f"{max(left, 0.001):.3f}"},
                                            timeout_s=left + 0.5, idle_timeout_s=self.deadlines.request_timeout_s)
        except PodUnreachable as exc:
            log.warning("%s", exc)
            await self.sync.refresh(url)
            return None
        finally:
            for loaded in loads:
                if answer is not None and answer.status_code == 200:
                    self.model_map.record_loaded(url, loaded, self.model_map.estimated_bytes(loaded))
                else:
                    self.model_map.release_load(url, loaded)
            if answer is None:
                self.model_map.end_request(url, model)
        answer.on_close(lambda: self.model_map.end_request(url, model))
        if answer.status_code >= 500:
            log.warning("worker %s answered %s for %s", url, answer.status_code, model)
            self.model_map.mark_copy_failed(url, model)
        return answer
