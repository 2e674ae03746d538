"""What the operator asks worker pods over HTTP: their status reports, all at once, as they change.

The worker's ``GET /status`` (hotset_common.wire.WorkerStatus) is the source
of truth for which copies exist. A whole report carries the pod's catalog and
every copy (1.66 MB at 10,000 models), and the pool loop asks every pod every
``pool_sync_interval_s``; so each pod is followed from the cursor of its last
report (``hotset_common.status_follow``, the protocol the router reads too):
an idle pod answers a few hundred bytes, a busy one what changed. The whole
state comes on first contact and after the worker restarted, in pages read
one after another. What the pass hands on is each pod's whole report as of
now, rebuilt from what the follower holds (catalogs left out: the operator
has its own).

Every pod is asked concurrently, each request with a short timeout, so one
slow or dead pod costs the pass `timeout_s`, not a sum over pods; nothing is
held locked meanwhile. A pod that does not answer is absent from that pass's
reports, as before; its cursor is kept (the worker keeps no state per
caller, so the next answer is still what changed since).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable

import httpx
import pydantic

from hotset_common.status_follow import DEFAULT_PAGE, StatusFollower
from hotset_common.wire import WorkerStatus
from hotset_common.worker_identity import BearerToken
from hotset_operator.index import WorkerPod

log = logging.getLogger(__name__)
LARGE_REPORT = 64 * 1024  # bytes: a report this long takes milliseconds to parse
MAX_PAGES = 100  # pages of one pod in one pass (50,000 entries); the rest comes on the next pass

PodKey = tuple[str, str]  # (namespace, pod name)


class _Bearer(httpx.Auth):
    """The operator's credential on every call: workers in cluster mode answer only the router's and
    the operator's own ServiceAccount tokens, read again as the kubelet rotates them (docs/security.md)."""

    def __init__(self, credential: BearerToken) -> None:
        self.credential = credential

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        request.headers.update(self.credential.headers())
        yield request


def client(credential: BearerToken | None = None, timeout_s: float = 2.0, pods: int = 64) -> httpx.AsyncClient:
    """One pooled client for every report (a connection kept per pod)."""
    limits = httpx.Limits(max_connections=pods, max_keepalive_connections=pods)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), auth=_Bearer(credential or BearerToken()), limits=limits)


async def _parse(body: bytes) -> WorkerStatus:
    if len(body) > LARGE_REPORT:  # parsed off the event loop: kopf's watches keep flowing
        return await asyncio.to_thread(WorkerStatus.model_validate_json, body)
    return WorkerStatus.model_validate_json(body)


class Reports:
    """Every running worker pod's report, each followed from its cursor (see the module docstring)."""

    def __init__(self, http: httpx.AsyncClient, port: int, page: int = DEFAULT_PAGE,
                 clock: Callable[[], float] = time.monotonic,
                 on_bytes: Callable[[int], None] = lambda n: None) -> None:
        self.http = http
        self.port = port
        self.page = page
        self.clock = clock
        self.on_bytes = on_bytes  # bytes of every answer read (hotset_operator_report_bytes_total)
        self._followers: dict[PodKey, tuple[str, StatusFollower]] = {}  # key -> (the pod's IP, its follower)

    async def fetch(self, pods: Iterable[WorkerPod]) -> dict[PodKey, WorkerStatus]:
        """Status of every running pod with an IP, by (namespace, name); silent pods are simply absent."""
        asked = [pod for pod in pods if pod.ip and pod.phase == "Running" and not pod.deleting]
        keys = {(pod.namespace, pod.name) for pod in asked}
        for gone in self._followers.keys() - keys:
            del self._followers[gone]
        answers = await asyncio.gather(*(self._follow(pod) for pod in asked))
        now = self.clock()
        found: dict[PodKey, WorkerStatus] = {}
        for pod, answered in zip(asked, answers):
            report = self._followers[(pod.namespace, pod.name)][1].report(now) if answered else None
            if report is not None:
                found[(pod.namespace, pod.name)] = report
        return found

    def follower(self, pod: WorkerPod) -> StatusFollower:
        key = (pod.namespace, pod.name)
        held = self._followers.get(key)
        if held is None or held[0] != pod.ip:  # a new pod, or one that moved: from its whole state
            held = self._followers[key] = (pod.ip, StatusFollower(self.page))
        return held[1]

    async def _follow(self, pod: WorkerPod) -> bool:
        """Read `pod`'s changes since its cursor (every page that waits); False: it did not answer."""
        follower = self.follower(pod)
        for _ in range(MAX_PAGES):
            asked_at = self.clock()
            try:
                response = await self.http.get(f"http://{pod.ip}:{self.port}/status", params=follower.query())
                response.raise_for_status()
                self.on_bytes(len(response.content))
                status = await _parse(response.content)
            except (httpx.HTTPError, pydantic.ValidationError, ValueError) as exc:
                log.info("worker pod %s gave no status: %s", pod.name, exc)
                return False
            if follower.apply(status, asked_at):
                return True
        return True  # the rest of a long read waits for the next pass (report() is None until it is in)

