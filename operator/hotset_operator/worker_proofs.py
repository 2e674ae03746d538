"""Worker pods that prove which pod they are, and the catalog's readers (docs/security.md, "Workers
that prove who they are"; hotset_common.worker_identity).

With worker identity on, the operator asks a worker pod nothing, and sends it no token, until the
pod proved it is the pod the cluster says is at its address: ``ProvenPods`` asks each owned pod
for its identity token (``GET /identity``, with no credential), has the API server review it once
per token and checks it names that very pod (uid) of the workers' ServiceAccount. And the catalog
feed answers a pool's catalog only to that pool's own pods (``CatalogReaders``): a worker presents
its catalog token, the API server says which pod it is bound to, and that pod must be a worker of
the operator's (its Deployments own it) in the catalog's namespace and pool.

Both run on kopf's event loop; reviews run on threads, kept per token (ReviewedTokens), so a pass
where no pod changed makes no API call.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

import httpx

from hotset_common import http, labels, worker_identity as identity
from hotset_common.answers import Answers
from hotset_common.worker_identity import PodIdentity, PodProofs, ReviewedTokens, ReviewFailed
from hotset_operator.index import WorkerPod

log = logging.getLogger(__name__)
READER_TTL_S = 60.0  # a catalog reader's decision is kept this long (its token's review, longer)


def identity_of(pod: WorkerPod) -> PodIdentity:
    return PodIdentity(pod.namespace, pod.name, pod.uid)


class ProvenPods:
    """Which of the owned worker pods proved which pod they are (asked at once, each with a timeout)."""

    def __init__(self, tokens: ReviewedTokens, account: str, port: int, timeout_s: float = 2.0) -> None:
        self.proofs = PodProofs(tokens, account)
        self.port = port
        # No credential on this client: a pod is asked for its identity before it gets the operator's token.
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))
        self._refused: dict[tuple[str, str], str] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _identity(self, pod: WorkerPod) -> str:
        answer = await self._http.get(f"http://{pod.ip}:{self.port}{identity.IDENTITY_PATH}")
        if answer.status_code != 200:
            raise ValueError(f"it answered {answer.status_code}")
        return identity.token_of_answer(answer.json())

    async def only_proven(self, pods: Iterable[WorkerPod]) -> tuple[list[WorkerPod], dict[tuple[str, str], str]]:
        """The pods that proved themselves, and why each other one (with an address) did not. A pod
        without an address yet, or not running, is left out of both: it is asked nothing anyway."""
        asked = [pod for pod in pods if pod.ip and pod.phase == "Running" and not pod.deleting]
        keys = [f"{pod.namespace}/{pod.name}" for pod in asked]
        answers = await asyncio.gather(*(self.proofs.prove(key, identity_of(pod), lambda pod=pod: self._identity(pod))
                                         for key, pod in zip(keys, asked)))
        self.proofs.keep_only(keys)
        proven = [pod for pod, why in zip(asked, answers) if not why]
        refused = {(pod.namespace, pod.name): why for pod, why in zip(asked, answers) if why}
        for key in refused:
            if self._refused.get(key) != refused[key]:
                log.warning("pod %s/%s is not asked for reports: it did not prove which pod it is: %s", *key,
                            refused[key])
        self._refused = refused
        return proven, refused


def store_pool(store: str) -> str:
    """The pool (labels.pool_of) whose pods follow catalog `store` (workloads.catalog_store)."""
    return labels.SHARED_POOL if store == "pool" else store


class CatalogReaders:
    """Who may read a catalog: a worker pod of the operator's, of that catalog's namespace and pool,
    presenting its catalog token. `workers()`: the owned worker pods now (the pools' view)."""

    def __init__(self, tokens: ReviewedTokens, account: str, workers: Callable[[], Iterable[WorkerPod]],
                 clock: Callable[[], float]) -> None:
        self.tokens = tokens
        self.account = account
        self.workers = workers
        self._decided: Answers[tuple[str, str, str], str] = Answers(READER_TTL_S, READER_TTL_S, 10_000, clock)

    async def refusal(self, authorization: str, namespace: str, store: str) -> tuple[int, str] | None:
        """None: the caller may read the catalog; else the status and message of the refusal."""
        token = http.bearer_token({http.AUTHORIZATION: authorization})
        if not token:
            return 401, (f"this catalog answers only its pool's worker pods: send 'Authorization: Bearer <token>', "
                         f"the pod's ServiceAccount token for the audience {identity.CATALOG_AUDIENCE!r}")
        try:
            why = await self._decided.get((token, namespace, store), lambda: self._decide(token, namespace, store))
        except ReviewFailed as exc:
            return 503, f"could not check the pod's token: {exc}; try again"
        if why.startswith("401 "):
            return 401, why[4:]
        return (403, why) if why else None

    async def _decide(self, token: str, namespace: str, store: str) -> str:
        """"" to serve; else the refusal ("401 " first when the token authenticates nobody)."""
        reviewed = await self.tokens.who(token)
        if reviewed is None:
            return (f"401 the token authenticates nobody for the audience {identity.CATALOG_AUDIENCE!r} "
                    "(expired, revoked, another audience, or its pod is gone)")
        uid = reviewed.extra_value(identity.POD_UID_EXTRA)
        pod = next((p for p in self.workers() if uid and p.uid == uid), None)
        if pod is None:
            return f"{reviewed.user} is not a worker pod of the operator's (its token names pod uid {uid[:8] or 'none'})"
        why = identity.why_not_proven(reviewed, identity_of(pod), self.account)
        if why:
            return f"pod {pod.namespace}/{pod.name} may not read it: {why}"
        if (pod.namespace, pod.pool) != (namespace, store_pool(store)):
            return (f"pod {pod.namespace}/{pod.name} follows the catalog of {pod.namespace}/{pod.pool or 'no pool'}, "
                    f"not {namespace}/{store}")
        return ""
