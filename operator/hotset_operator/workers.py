"""What the operator asks worker pods over HTTP: their status reports, all at once.

The worker's ``GET /status`` (hotset_common.wire.WorkerStatus) is the source
of truth for which copies exist. Every pod is asked concurrently, each with a
short timeout, so one slow or dead pod costs the pass `timeout_s`, not a sum
over pods; nothing is held locked meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable

import httpx
import pydantic

from hotset_common.wire import WorkerStatus
from hotset_common.worker_identity import BearerToken
from hotset_operator.index import WorkerPod

log = logging.getLogger(__name__)
LARGE_REPORT = 64 * 1024  # bytes: a report this long takes milliseconds to parse


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


async def _report(http: httpx.AsyncClient, pod: WorkerPod, port: int) -> WorkerStatus | None:
    try:
        response = await http.get(f"http://{pod.ip}:{port}/status")
        response.raise_for_status()
        if len(response.content) > LARGE_REPORT:  # parsed off the event loop: kopf's watches keep flowing
            return await asyncio.to_thread(WorkerStatus.model_validate_json, response.content)
        return WorkerStatus.model_validate_json(response.content)
    except (httpx.HTTPError, pydantic.ValidationError, ValueError) as exc:
        log.info("worker pod %s gave no status: %s", pod.name, exc)
        return None


async def fetch_reports(http: httpx.AsyncClient, pods: Iterable[WorkerPod], port: int) -> dict[tuple[str, str], WorkerStatus]:
    """Status of every running pod with an IP, by (namespace, name); silent pods are simply absent."""
    asked = [pod for pod in pods if pod.ip and pod.phase == "Running" and not pod.deleting]
    answers = await asyncio.gather(*(_report(http, pod, port) for pod in asked))
    return {(pod.namespace, pod.name): report for pod, report in zip(asked, answers) if report is not None}
