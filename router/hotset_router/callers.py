"""Who is calling the router, and whether they may call the model they name (docs/security.md, "Callers").

Off (``--auth none``: the local stack, standalone routers) every call passes.
On (``--auth kubernetes``, the chart's default) the cluster answers both
questions in its own terms, as it does for kubectl:

- *who*: the request's bearer token goes to a TokenReview with the router's
  audiences. ServiceAccount tokens made for that audience pass (``kubectl
  create token SA --audience hotset``, or a projected token volume), and so
  does anything else the API server authenticates (an OIDC issuer it trusts);
  a token for another audience (a pod's default one, made for the API server)
  does not, so a token given to the router cannot be replayed elsewhere. A
  token of an OIDC issuer the router is configured with (``--auth-config``,
  Kubernetes' own AuthenticationConfiguration format) is verified by the router
  itself first (jwt_issuers.py), with no API call;
- *may they*: a SubjectAccessReview of ``create`` on ``servedmodels/predict``
  for that model by name, in its namespace. That is RBAC: a RoleBinding to the
  chart's caller ClusterRole grants a namespace's models, ``resourceNames``
  single ones.

Answers are kept for a short time (by the token's SHA-256, and by caller,
namespace and model), allowed and refused ones apart, so a request on the hot
path makes no API call; callers asking the same question at once share one
review; reviews run on a thread (the kubernetes client blocks) with a timeout.
An API server that does not answer is a 503 with Retry-After, never a pass.
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Protocol, TypeVar

from hotset_common import errors, http, wire
from hotset_common import spec as spec_module
from hotset_common.answers import Answers
from hotset_router.jwt_issuers import Identity, IssuerUnavailable, JwtAuthenticator, JwtIssuers, Refusal

log = logging.getLogger(__name__)
Value = TypeVar("Value")

CALL_VERB = "create"  # what calling a model is, in RBAC's terms: create on servedmodels/predict
PREDICT_SUBRESOURCE = "predict"
DEFAULT_AUDIENCE = "hotset"


class AuthMode(str, enum.Enum):
    NONE = "none"  # every call passes (loopback, standalone)
    KUBERNETES = "kubernetes"  # TokenReview + SubjectAccessReview (cluster mode)


@dataclasses.dataclass(frozen=True)
class Caller:
    """An authenticated identity, as the API server names it (the fields a SubjectAccessReview takes)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # When its token expires (a JWT verified here), checked on each use of a kept identity; not part
    # of who it is, so its grants are kept per caller, not per token.
    expires: float | None = dataclasses.field(default=None, compare=False)


class Reviews(Protocol):
    """The two questions, asked of whoever decides them. Both block (they run on a thread)."""

    def who(self, token: str) -> Caller | None:
        """The caller `token` authenticates; None: it authenticates nobody (for these audiences)."""

    def may(self, caller: Caller, namespace: str, name: str | None) -> bool:
        """Whether `caller` may call model `name` of `namespace` (None: every model there)."""


class KubernetesReviews:
    """TokenReview and SubjectAccessReview through the kubernetes client (the router's own identity:
    the chart grants it ``create`` on both, and nothing that reads secrets)."""

    def __init__(self, api_client: Any, audiences: tuple[str, ...], timeout_s: float = 5.0) -> None:
        from kubernetes import client  # cluster mode only

        self._client = client
        self._authentication = client.AuthenticationV1Api(api_client)
        self._authorization = client.AuthorizationV1Api(api_client)
        self.audiences = audiences
        self.timeout_s = timeout_s

    def who(self, token: str) -> Caller | None:
        c = self._client
        spec = c.V1TokenReviewSpec(token=token, audiences=list(self.audiences) or None)
        status = self._authentication.create_token_review(c.V1TokenReview(spec=spec),
                                                          _request_timeout=self.timeout_s).status
        if status is None or not status.authenticated or status.user is None:
            return None
        if self.audiences and not set(status.audiences or ()) & set(self.audiences):
            return None  # an API server that ignores audiences must not let another audience's token in
        user = status.user
        extra = tuple(sorted((key, tuple(values)) for key, values in (user.extra or {}).items()))
        return Caller(user.username or "", user.uid or "", tuple(user.groups or ()), extra)

    def may(self, caller: Caller, namespace: str, name: str | None) -> bool:
        c = self._client
        attributes = c.V1ResourceAttributes(group=spec_module.GROUP, resource=spec_module.PLURAL,
                                            subresource=PREDICT_SUBRESOURCE, verb=CALL_VERB, namespace=namespace,
                                            name=name)
        spec = c.V1SubjectAccessReviewSpec(user=caller.name, uid=caller.uid or None, groups=list(caller.groups) or None,
                                           extra={key: list(values) for key, values in caller.extra} or None,
                                           resource_attributes=attributes)
        status = self._authorization.create_subject_access_review(c.V1SubjectAccessReview(spec=spec),
                                                                  _request_timeout=self.timeout_s).status
        return bool(status is not None and status.allowed)


@dataclasses.dataclass(frozen=True)
class CallerSettings:
    mode: AuthMode = AuthMode.NONE
    audiences: tuple[str, ...] = (DEFAULT_AUDIENCE,)
    cache_s: float = 30.0  # how long an identity or a grant is kept
    refused_cache_s: float = 5.0  # how long a refusal is kept
    max_entries: int = 10_000  # of each cache
    review_timeout_s: float = 5.0
    retry_after_s: int = 5  # when the API server did not answer
    issuers: tuple[JwtAuthenticator, ...] = ()  # OIDC issuers whose tokens the router verifies itself


class Callers:
    """`check` before a request reaches a model (inference, metadata, readiness: every protocol);
    `visible` for what a listing may show."""

    def __init__(self, reviews: Reviews | None, namespace_of: Callable[[str], str | None],
                 settings: CallerSettings = CallerSettings(), clock: Callable[[], float] = time.monotonic,
                 on_review: Callable[[str, str], None] = lambda question, answer: None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`on_review(question, answer)` after each check: "who" or "may" (an API call), or "jwt" (a
        token verified here); "yes", "no" or "error"."""
        if settings.mode == AuthMode.KUBERNETES and reviews is None:
            raise ValueError("--auth kubernetes needs the Kubernetes API (cluster mode)")
        self.settings = settings
        self.reviews = reviews if settings.mode == AuthMode.KUBERNETES else None
        self.namespace_of = namespace_of
        self.on_review = on_review
        self._wall_clock = wall_clock
        self.issuers = JwtIssuers(settings.issuers, settings.review_timeout_s)
        self._verified: Answers[str, Caller | Refusal] = Answers(settings.cache_s, settings.refused_cache_s,
                                                                 settings.max_entries, clock)
        self._identities: Answers[str, Caller | None] = Answers(settings.cache_s, settings.refused_cache_s,
                                                                settings.max_entries, clock)
        self._grants: Answers[tuple[Caller, str, str | None], bool] = Answers(
            settings.cache_s, settings.refused_cache_s, settings.max_entries, clock)

    @property
    def enabled(self) -> bool:
        return self.reviews is not None

    async def check(self, headers: Mapping[str, str], model: str) -> str | None:
        """The namespace of `model` (None: no ServedModel declares it) if this request may reach it; else raise: 404 when it names another namespace
        than the model's (or, with callers checked, no watched namespace declares the model), 401
        without a token that authenticates, 403 when its caller may not call the model, 503 when the
        API server did not answer. A cached answer returns without awaiting anything."""
        owner = self.namespace_of(model)
        requested = headers.get(wire.NAMESPACE_HEADER)
        if requested is not None and requested != owner and (owner is not None or self.enabled):
            raise errors.ModelNotFound(f"no model {errors.excerpt(model)} in namespace {errors.excerpt(requested)}")
        if self.reviews is None:
            return owner
        caller = await self.caller(headers)
        if owner is None:
            raise errors.ModelNotFound(f"model {errors.excerpt(model)} is not declared by a ServedModel in the "
                                       "namespaces this router serves")
        if not await self._may(caller, owner, model):
            raise errors.Forbidden(
                f"{caller.name} may not call model {model!r} of namespace {owner!r}: that takes '{CALL_VERB}' on "
                f"'{spec_module.PLURAL}/{PREDICT_SUBRESOURCE}' ({spec_module.GROUP}) there, for example a "
                "RoleBinding to the chart's model-caller ClusterRole")
        return owner

    async def caller(self, headers: Mapping[str, str]) -> Caller:
        """The request's caller; 401 naming what is missing. With callers unchecked: anonymous."""
        if self.reviews is None:
            return Caller("system:anonymous")
        token = http.bearer_token(headers)
        if not token:
            raise errors.Unauthorized("this router serves authenticated callers: send 'Authorization: Bearer "
                                      f"<token>', a token for the audience {', '.join(self.settings.audiences)!r} "
                                      "(kubectl create token <service-account> --audience ...)")
        digest = hashlib.sha256(token.encode()).hexdigest()
        refusal = None
        issuer = self.issuers.issuer_for(token)
        if issuer is not None:
            verified = await self._verified.get(digest, lambda: self._review("jwt", self._verify, issuer, token))
            if isinstance(verified, Caller):
                if verified.expires is not None and verified.expires <= self._wall_clock():
                    raise errors.Unauthorized(f"the bearer token of {issuer.url} has expired")
                return verified
            refusal = verified  # the API server may still authenticate it, as it tries each authenticator
        caller = await self._identities.get(digest, lambda: self._review("who", self.reviews.who, token))  # type: ignore[union-attr]
        if caller is None:
            raise errors.Unauthorized("the bearer token authenticates nobody here: " + (
                f"{refusal.reason}, and the API server does not authenticate it either" if refusal is not None else
                f"it is expired, revoked, or made for another audience than {', '.join(self.settings.audiences)!r}"))
        return caller

    @staticmethod
    def _verify(issuer: Any, token: str) -> Caller | Refusal:
        found = issuer.who(token)
        if isinstance(found, Identity):
            return Caller(found.name, found.uid, found.groups, expires=found.expires)
        return found

    async def visible(self, headers: Mapping[str, str], models: Iterable[str]) -> list[str]:
        """Those of `models` a listing may show this request: of its namespace, when it names one, and,
        with callers checked, of namespaces where its caller may call every model (a grant of single
        models by ``resourceNames`` lets a caller call them, not list them). 401 as ``check``."""
        requested = headers.get(wire.NAMESPACE_HEADER)
        owners = {model: self.namespace_of(model) for model in models}
        if requested is not None:
            owners = {model: owner for model, owner in owners.items() if owner == requested or
                      (owner is None and not self.enabled)}
        if self.reviews is None:
            return list(owners)
        caller = await self.caller(headers)
        namespaces = {owner for owner in owners.values() if owner is not None}
        allowed = {namespace for namespace in namespaces if await self._may(caller, namespace, None)}
        return [model for model, owner in owners.items() if owner in allowed]

    async def _may(self, caller: Caller, namespace: str, name: str | None) -> bool:
        return await self._grants.get((caller, namespace, name),
                                      lambda: self._review("may", self.reviews.may, caller, namespace, name))  # type: ignore[union-attr]

    async def _review(self, question: str, ask: Callable[..., Value], *args: Any) -> Value:
        try:
            answer = await asyncio.to_thread(ask, *args)
        except IssuerUnavailable as exc:  # the issuer's keys could not be fetched: never a pass
            log.warning("caller check (%s) failed: %s", question, exc)
            self.on_review(question, "error")
            raise errors.BackendUnavailable(f"could not check the caller's token: {exc}; try again",
                                            self.settings.retry_after_s) from None
        except Exception as exc:  # an API error, a timeout, a refused connection: say so, never pass
            log.warning("caller review (%s) failed: %s", question, exc)
            self.on_review(question, "error")
            raise errors.BackendUnavailable(
                f"could not check the caller with the Kubernetes API ({type(exc).__name__}); try again",
                self.settings.retry_after_s) from None
        self.on_review(question, "yes" if answer else "no")
        return answer


ANONYMOUS = Callers(None, lambda model: None)
