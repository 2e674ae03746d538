"""Workers that prove who they are, and callers that prove who they are to workers: per-pod
credentials from Kubernetes itself (docs/security.md, "Workers that prove who they are").

Every credential here is a ServiceAccount token the kubelet projects into a pod (an audience of
its own, ``TOKEN_SECONDS`` long, rewritten by the kubelet before it expires) and each audience is
accepted by exactly one verifier, for one purpose:

- ``CALLER_AUDIENCE``: the router's and the operator's own tokens, sent to worker pods with every
  call. A worker verifies them offline, against the cluster's ServiceAccount issuer and keys the
  operator copies into a ConfigMap it mounts (``KEYS_CONFIGMAP``), and answers only the accounts
  it is told (the router's and the operator's): worker pods need no Kubernetes API access and no
  network path to the API server;
- ``IDENTITY_AUDIENCE``: a worker pod's own token, bound to the pod (its name and uid are in the
  token), handed to whoever asks ``GET IDENTITY_PATH``. The router and the operator ask it before
  they send a pod anything, have the API server review it (TokenReview) and accept the pod only
  when the token is the workers' ServiceAccount's, bound to the very pod discovered at that
  address (``why_not_proven``). A pod presenting another pod's token, or none, gets no request
  and no credential. Anyone may read this token; it is good for nothing but that proof, and the
  proof holds only at the pod's own address;
- ``CATALOG_AUDIENCE``: a worker pod's token for the operator's catalog feed, sent only there;
  the operator serves a pool's catalog to that pool's pods only.

``BearerToken`` reads a projected token file again as the kubelet rewrites it; ``PodProofs``
keeps which pods proved themselves, asking again shortly before the token they proved with
expires. The local stack (no cluster) uses none of this: its workers run anonymous on loopback,
or with one fixed token (``BearerToken(token=...)``).
"""
from __future__ import annotations

import asyncio
import base64
import enum
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Mapping

from hotset_common.answers import Answers

log = logging.getLogger(__name__)

CALLER_AUDIENCE = "hotset-worker"  # tokens the router and the operator present to worker pods
IDENTITY_AUDIENCE = "hotset-worker-identity"  # a worker pod's proof of which pod it is
CATALOG_AUDIENCE = "hotset-catalog"  # a worker pod's token for its pool's catalog feed
TOKEN_SECONDS = 600  # expirationSeconds of each projected token: the API server's minimum
IDENTITY_PATH = "/identity"  # where a worker hands out its identity token (no credential needed)

WORKER_ACCOUNT = "hotset-worker"
ROUTER_ACCOUNT = "hotset-router"
OPERATOR_ACCOUNT = "hotset-operator"

# The cluster's ServiceAccount issuer and its public keys, as the operator copies them for workers.
KEYS_CONFIGMAP = "hotset-issuer-keys"
ISSUER_KEY = "issuer"
JWKS_KEY = "jwks.json"
KEYS_DIR = "/var/run/hotset/issuer-keys"
# Where the projected tokens are mounted: the router's and the operator's token for workers; a
# worker pod's identity and catalog tokens (one projected volume, a file each).
TOKENS_DIR = "/var/run/secrets/hotset"
CALLER_TOKEN_FILE = "worker-caller"
IDENTITY_TOKEN_FILE = "identity"
CATALOG_TOKEN_FILE = "catalog"

# What a TokenReview says of a token bound to a pod (user.extra).
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
ACCOUNT_PREFIX = "system:serviceaccount:"


class WorkerIdentity(str, enum.Enum):
    """Whether worker pods and their callers prove who they are (the chart: always)."""

    NONE = "none"  # no proof: standalone routers, the local stack, tests with hand-made pods
    POD_TOKEN = "pod-token"  # projected ServiceAccount tokens, as this module says


def account_user(namespace: str, name: str) -> str:
    """The user name of a ServiceAccount, as the API server names it."""
    return f"{ACCOUNT_PREFIX}{namespace}:{name}"


def parse_accounts(text: str) -> tuple[str, ...]:
    """``namespace:name`` entries, comma-separated (kubectl's ``--serviceaccount`` spelling), as user
    names; ValueError naming an entry that is not one."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        namespace, sep, name = item.partition(":")
        if not sep or not namespace or not name or ":" in name:
            raise ValueError(f"{item!r} is not a ServiceAccount as namespace:name")
        found.append(account_user(namespace, name))
    return tuple(found)


def token_claims(token: str) -> dict[str, Any]:
    """A JWT's claims, NOT verified: only to know when a token that was verified expires. {}: not a JWT."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def token_expiry(token: str) -> float | None:
    """The unix time a token says it expires (unverified; see token_claims); None: it says nothing."""
    exp = token_claims(token).get("exp")
    return float(exp) if isinstance(exp, (int, float)) else None


class BearerToken:
    """A bearer credential: a fixed token (the local stack) or a file the kubelet rewrites (a
    projected ServiceAccount token), read again at most every `reread_s` seconds so a rotated
    token is used from then on. An unreadable file reads as no token (the caller is refused and
    says so) until it can be read."""

    def __init__(self, token: str = "", path: Path | str | None = None, reread_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path) if path else None
        self._token = token.strip()
        self.reread_s = reread_s
        self._clock = clock
        self._read_at = float("-inf")

    def __bool__(self) -> bool:
        return bool(self.path) or bool(self._token)

    def value(self) -> str:
        if self.path is not None and self._clock() - self._read_at >= self.reread_s:
            try:
                self._token = self.path.read_text().strip()
            except OSError as exc:
                log.warning("cannot read the token file %s: %s", self.path, exc)
                self._token = ""
            self._read_at = self._clock()
        return self._token

    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer <token>``; {} without a token."""
        token = self.value()
        return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class PodIdentity:
    """Which pod the cluster says is at an address: what a worker's token must be bound to."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Reviewed:
    """Who the API server says a token is (a TokenReview's status.user)."""

    user: str
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    expires: float | None = None  # the token's own exp (unix time)

    def extra_value(self, key: str) -> str:
        return next((values[0] for k, values in self.extra if k == key and values), "")


def why_not_proven(reviewed: Reviewed | None, pod: PodIdentity, account: str = WORKER_ACCOUNT) -> str:
    """"" when `reviewed` is the token of the workers' ServiceAccount in the pod's namespace, bound to
    `pod` itself (by uid); otherwise why not, for a log line."""
    if reviewed is None:
        return ("its token authenticates nobody for the audience "
                f"{IDENTITY_AUDIENCE!r} (expired, revoked, another audience, or its pod is gone)")
    expected = account_user(pod.namespace, account)
    if reviewed.user != expected:
        return f"its token is {reviewed.user}'s, not the workers' ServiceAccount {expected}"
    uid = reviewed.extra_value(POD_UID_EXTRA)
    if not uid:
        return "its token is bound to no pod"
    if uid != pod.uid:
        name = reviewed.extra_value(POD_NAME_EXTRA) or "?"
        return (f"its token is bound to pod {name} (uid {uid[:8]}), not to {pod.name} (uid {pod.uid[:8]}), "
                "the pod at this address")
    return ""


class TokenReviews:
    """TokenReview of one audience through the kubernetes client (blocking: run it on a thread).
    The router and the operator have ``create`` on tokenreviews; nothing else is read."""

    def __init__(self, api_client: Any, audience: str, timeout_s: float = 5.0) -> None:
        from kubernetes import client  # the router's and the operator's, never the worker's

        self._client = client
        self._api = client.AuthenticationV1Api(api_client)
        self.audience = audience
        self.timeout_s = timeout_s

    def __call__(self, token: str) -> Reviewed | None:
        c = self._client
        spec = c.V1TokenReviewSpec(token=token, audiences=[self.audience])
        status = self._api.create_token_review(c.V1TokenReview(spec=spec), _request_timeout=self.timeout_s).status
        if status is None or not status.authenticated or status.user is None:
            return None
        if self.audience not in (status.audiences or ()):
            return None  # an API server that ignores audiences must not let another audience's token in
        extra = tuple(sorted((key, tuple(values)) for key, values in (status.user.extra or {}).items()))
        return Reviewed(status.user.username or "", extra, token_expiry(token))


Review = Callable[[str], "Reviewed | None"]


class ReviewedTokens:
    """Reviews of tokens, each asked once at a time and kept: an identity until its token's expiry
    (at most `ttl_s`), a refusal `refused_ttl_s`; run on a thread, never on the event loop. A review
    that fails (the API server does not answer) raises ReviewFailed and is not kept."""

    def __init__(self, review: Review, ttl_s: float = 300.0, refused_ttl_s: float = 5.0, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self._review = review
        self._wall = wall_clock
        self._answers: Answers[str, Reviewed | None] = Answers(ttl_s, refused_ttl_s, max_entries, clock,
                                                                lifetime=self._left)

    def _left(self, reviewed: Reviewed | None) -> float | None:
        if reviewed is None or reviewed.expires is None:
            return None
        return max(reviewed.expires - self._wall(), 0.0)

    async def who(self, token: str) -> Reviewed | None:
        try:
            return await self._answers.get(token, lambda: asyncio.to_thread(self._review, token))
        except Exception as exc:  # an API error, a timeout: never a pass
            raise ReviewFailed(f"the API server did not review the token ({type(exc).__name__}: {exc})") from exc


class ReviewFailed(Exception):
    """The API server could not be asked: the token is neither accepted nor refused."""


@dataclass(frozen=True)
class _Proven:
    pod: PodIdentity
    until: float  # unix time: ask again then (shortly before its token expires)


class PodProofs:
    """Which worker pods proved who they are, by key (the router's pod URL, the operator's pod name).

    ``prove`` asks a pod for its identity token (`fetch`, ``GET IDENTITY_PATH``, no credential
    sent) unless it proved itself with a token that is still good for `renew_s`; the token is
    reviewed (ReviewedTokens) and checked against the pod discovered there (``why_not_proven``).
    Cost follows change: a proven pod is asked again once per token, shortly before it expires (the
    kubelet has written the next one by then), and a review is asked once per token."""

    def __init__(self, tokens: ReviewedTokens, account: str = WORKER_ACCOUNT, renew_s: float = 60.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.tokens = tokens
        self.account = account
        self.renew_s = renew_s
        self._wall = wall_clock
        self._proven: dict[str, _Proven] = {}

    def proven(self, key: str, pod: PodIdentity | None) -> bool:
        held = self._proven.get(key)
        return held is not None and pod is not None and held.pod == pod and held.until > self._wall()

    async def prove(self, key: str, pod: PodIdentity | None, fetch: Callable[[], Awaitable[str]]) -> str:
        """"" when the pod at `key` is `pod` and proved it; otherwise why not (it is then not proven)."""
        if pod is None:
            self._proven.pop(key, None)
            return "the cluster names no pod at this address"
        if self.proven(key, pod):
            return ""
        try:
            token = (await fetch()).strip()
        except Exception as exc:  # noqa: BLE001 - any failure to answer is a pod that did not prove itself
            why = f"it gave no identity token at {IDENTITY_PATH} ({exc})"
        else:
            why = await self._check(token, pod) if token else f"it gave no identity token at {IDENTITY_PATH}"
        if why:
            self._proven.pop(key, None)
            return why
        expires = token_expiry(token) or self._wall() + TOKEN_SECONDS
        self._proven[key] = _Proven(pod, expires - self.renew_s)
        return ""

    async def _check(self, token: str, pod: PodIdentity) -> str:
        try:
            reviewed = await self.tokens.who(token)
        except ReviewFailed as exc:
            return str(exc)
        return why_not_proven(reviewed, pod, self.account)

    def forget(self, key: str) -> None:
        self._proven.pop(key, None)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget every pod but `keys` (those still discovered)."""
        wanted = set(keys)
        for key in [k for k in self._proven if k not in wanted]:
            del self._proven[key]


def keys_data(issuer: str, jwks: Mapping[str, Any]) -> dict[str, str]:
    """The KEYS_CONFIGMAP's data (the files a worker reads): the issuer and the key set as JSON."""
    return {ISSUER_KEY: issuer, JWKS_KEY: json.dumps(dict(jwks), sort_keys=True)}


def identity_answer(pod: str, token: str) -> dict[str, str]:
    """What a worker answers at IDENTITY_PATH."""
    return {"pod": pod, "token": token}


def token_of_answer(body: Mapping[str, Any]) -> str:
    """The token of an IDENTITY_PATH answer ("" when it holds none)."""
    token = body.get("token") if isinstance(body, Mapping) else None
    return token if isinstance(token, str) else ""
