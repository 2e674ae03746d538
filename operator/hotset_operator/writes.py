"""Status and events, written in the background: at most `concurrency` calls at once, latest wins.

Deciding is fast and writing is not (each write is a round trip to the API
server), so what the operator decides is queued here instead of written
inline: the loops that decide never wait on the network, and ten thousand
newly accepted models become ten thousand status patches in flight eight at a
time, not a pass that stalls until the last one lands. A status queued for
an object that already has one waiting replaces it: only the newest is ever
written. Events (``Accepted``, ``QuotaExceeded``, ...) go after status.

A write that fails for a reason that may pass (the API server busy or
restarting) is queued again after `retry_s`; an object gone meanwhile (404)
needs nothing.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime
import logging
import socket
from typing import Any, Callable, Mapping

from kubernetes.client.exceptions import ApiException

from hotset_operator import kube
from hotset_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)
Target = tuple[str, str, str, str]  # (group, plural, namespace, name)
MAX_EVENTS = 20_000  # events queued beyond this are dropped (logged): status always goes first
MAX_MESSAGE = 1024


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def involved(kind: str, api_version: str, namespace: str, name: str, uid: str) -> dict[str, str]:
    """An event's involvedObject."""
    return {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name, "uid": uid}


class Writes:
    def __init__(self, kube_api: kube.Kube, metrics: OperatorMetrics, concurrency: int = 8,
                 retry_s: float = 1.0) -> None:
        self.kube = kube_api
        self.metrics = metrics
        self.concurrency = concurrency
        self.retry_s = retry_s
        self._status: dict[Target, tuple[Mapping[str, str], dict[str, Any]]] = {}  # insertion order: arrival
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._busy = 0
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="kube-write")
        self._instance = socket.gethostname()
        self.on_failed: Callable[[Target], None] = lambda target: None  # a status refused for good

    # --- what the loops queue -------------------------------------------------------------

    def status(self, resource: Mapping[str, str], namespace: str, name: str, status: dict[str, Any]) -> None:
        """Queue a merge patch of an object's status (replacing one queued for it and not yet sent)."""
        target = (resource["group"], resource["plural"], namespace, name)
        self._status.pop(target, None)
        self._status[target] = (resource, status)
        self._changed()

    def event(self, obj: Mapping[str, str], type: str, reason: str, message: str) -> None:
        """Queue an event about `obj` (``involved``) as kubectl describe shows it."""
        if len(self._events) >= MAX_EVENTS:
            log.warning("dropping event %s on %s/%s: %d events queued", reason, obj["namespace"], obj["name"],
                        len(self._events))
            return
        stamp = _now()
        self._events.append({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{obj['name']}.", "namespace": obj["namespace"]},
            "involvedObject": dict(obj), "type": type, "reason": reason, "message": message[:MAX_MESSAGE],
            "source": {"component": kube.FIELD_MANAGER}, "reportingComponent": kube.FIELD_MANAGER,
            "reportingInstance": self._instance, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
        self._changed()

    def pending(self) -> int:
        return len(self._status) + len(self._events) + self._busy

    def queued_status(self, resource: Mapping[str, str], namespace: str, name: str) -> dict[str, Any] | None:
        """The status still waiting to be written for this object, if any."""
        found = self._status.get((resource["group"], resource["plural"], namespace, name))
        return None if found is None else found[1]

    # --- the writers ------------------------------------------------------------------------

    async def run(self) -> None:
        """Write forever, `concurrency` at once (cancel to stop)."""
        workers = [asyncio.create_task(self._work(), name=f"kube-writer-{n}") for n in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._status and not self._events:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy += 1
            try:
                if self._status:
                    target = next(iter(self._status))
                    resource, status = self._status.pop(target)
                    await self._write_status(loop, target, resource, status)
                else:
                    await self._post_event(loop, self._events.popleft())
            finally:
                self._busy -= 1
                self.metrics.writes_pending.set(self.pending())

    async def _write_status(self, loop: asyncio.AbstractEventLoop, target: Target, resource: Mapping[str, str],
                            status: dict[str, Any]) -> None:
        _, _, namespace, name = target
        try:
            await loop.run_in_executor(self._executor, self.kube.patch_custom_status, namespace, name, resource, status)
        except ApiException as exc:
            if exc.status == 404:
                return
            if exc.status in (400, 403, 422):
                log.error("status of %s/%s refused (%s): %s", namespace, name, exc.status, (exc.body or "")[:300])
                self.on_failed(target)
                return
            self._retry_status(target, resource, status, exc)
            await asyncio.sleep(self.retry_s)
            return
        except Exception as exc:  # noqa: BLE001 - a connection error: the API server may be back soon
            self._retry_status(target, resource, status, exc)
            await asyncio.sleep(self.retry_s)
            return
        self.metrics.status_writes.labels(resource["plural"]).inc()

    def _retry_status(self, target: Target, resource: Mapping[str, str], status: dict[str, Any],
                      exc: BaseException) -> None:
        log.info("status of %s/%s not written (%s); trying again", target[2], target[3], exc)
        self._status.setdefault(target, (resource, status))  # a newer status queued meanwhile wins

    async def _post_event(self, loop: asyncio.AbstractEventLoop, event: dict[str, Any]) -> None:
        namespace = event["metadata"]["namespace"]
        try:
            await loop.run_in_executor(self._executor, self.kube.post_event, namespace, event)
        except ApiException as exc:
            if exc.status not in (403, 404, 422):
                log.info("event %s not posted (%s); dropped", event["reason"], exc.status)
        except Exception as exc:  # noqa: BLE001 - events are best effort, as kopf's
            log.info("event %s not posted: %s", event["reason"], exc)

    def _changed(self) -> None:
        self.metrics.writes_pending.set(self.pending())
        self._wake.set()
