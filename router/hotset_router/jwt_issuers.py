"""Callers whose tokens an OIDC issuer signed, verified by the router itself (docs/security.md, "Callers").

Where a cluster's API server cannot be told to trust a company's identity
provider (many managed clusters), the router can: the chart's
``router.auth.jwt`` is the ``jwt`` list of Kubernetes' own structured
``AuthenticationConfiguration`` (apiserver.config.k8s.io), so the same entries
work in both places. A token whose ``iss`` is a configured issuer's URL is
verified here, with that issuer's published keys (its OpenID discovery
document's ``jwks_uri``, fetched on first use and kept, refreshed for a key id
it does not know at most once per cooldown: PyJWT's ``PyJWKClient``):
signature (asymmetric algorithms only), expiry, issuer, one of the entry's
audiences and the claim rules. The identity is then mapped as the API server
maps it (username and groups from claims, with the entry's prefixes), and the
SubjectAccessReview that decides which models it may call is the same as for a
ServiceAccount. A token none of the entries accepts still goes to the
TokenReview, as the API server tries each of its authenticators in turn.

What Kubernetes' format can say beyond this (CEL ``expression`` mappings and
rules, ``extra``, ``egressSelectorType``, ``anonymous``) is refused when the
router starts, naming the field, rather than ignored: a rule dropped silently
would let in callers the configuration means to keep out.
"""
from __future__ import annotations

import dataclasses
import ssl
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hotset_common import errors

# Signatures the router accepts: public-key ones only, so no shared secret can forge a caller
# and no "none" or HMAC-with-the-public-key confusion is possible.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# Seconds of clock difference allowed on exp, nbf and iat.
LEEWAY_S = 10
DISCOVERY_PATH = "/.well-known/openid-configuration"
CONFIG_KINDS = ("apiserver.config.k8s.io/v1", "apiserver.config.k8s.io/v1beta1", "apiserver.config.k8s.io/v1alpha1")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Issuer(_Strict):
    url: str
    discovery_url: str = Field("", alias="discoveryURL")
    audiences: list[str] = Field(min_length=1)
    audience_match_policy: Literal["", "MatchAny"] = Field("", alias="audienceMatchPolicy")
    certificate_authority: str = Field("", alias="certificateAuthority")

    @model_validator(mode="after")
    def _https(self) -> "Issuer":
        for name, value in (("url", self.url), ("discoveryURL", self.discovery_url)):
            if value and not value.startswith("https://"):
                raise ValueError(f"issuer.{name} must be an https:// URL, got {errors.excerpt(value)}")
        if len(self.audiences) > 1 and self.audience_match_policy != "MatchAny":
            raise ValueError("issuer.audienceMatchPolicy must be MatchAny when several audiences are given")
        return self


class PrefixedClaim(_Strict):
    claim: str = Field(min_length=1)
    prefix: str  # required, as Kubernetes requires it: "" says on purpose that names are not prefixed


class OptionalPrefixedClaim(_Strict):
    claim: str = Field(min_length=1)
    prefix: str = ""


class Claim(_Strict):
    claim: str = Field(min_length=1)


class ClaimMappings(_Strict):
    username: PrefixedClaim
    groups: OptionalPrefixedClaim | None = None
    uid: Claim | None = None


class ClaimRule(_Strict):
    """A claim that must hold a value (Kubernetes' non-CEL ``claimValidationRules`` entry)."""

    claim: str = Field(min_length=1)
    required_value: str = Field(alias="requiredValue")


class JwtAuthenticator(_Strict):
    issuer: Issuer
    claim_mappings: ClaimMappings = Field(alias="claimMappings")
    claim_validation_rules: list[ClaimRule] = Field(default_factory=list, alias="claimValidationRules")


class AuthenticationConfiguration(_Strict):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["AuthenticationConfiguration"]
    jwt: list[JwtAuthenticator] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known(self) -> "AuthenticationConfiguration":
        if self.api_version not in CONFIG_KINDS:
            raise ValueError(f"apiVersion must be one of {', '.join(CONFIG_KINDS)}")
        urls = [entry.issuer.url for entry in self.jwt]
        if len(set(urls)) != len(urls):
            raise ValueError("two jwt entries name the same issuer.url")
        return self


def load_configuration(path: Path) -> tuple[JwtAuthenticator, ...]:
    """The jwt entries of the AuthenticationConfiguration file at `path`; SystemExit naming what is
    wrong with it (a field this router does not support included)."""
    try:
        document = yaml.safe_load(path.read_text())
        return tuple(AuthenticationConfiguration.model_validate(document).jwt)
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"hotset-router: cannot read the authentication configuration {path}: {exc}") from None
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: "
                    f"{'not supported by the router' if e['type'] == 'extra_forbidden' else e['msg']}"
                    for e in exc.errors()]
        raise SystemExit(f"hotset-router: the authentication configuration {path} is not usable: "
                         f"{errors.summarize(problems)}") from None


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a verified token names, in the fields a SubjectAccessReview takes; `expires`: its exp."""

    name: str
    uid: str
    groups: tuple[str, ...]
    expires: float


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a token of a configured issuer does not authenticate (falsy: kept as briefly as a refusal)."""

    reason: str

    def __bool__(self) -> bool:
        return False


class IssuerUnavailable(Exception):
    """The issuer's discovery document or keys could not be fetched (a 503, never a pass)."""


def unverified_issuer(token: str) -> str | None:
    """The ``iss`` a token claims, read without verifying anything (only to pick who verifies it);
    None for what is not a JWT."""
    import jwt

    if token.count(".") != 2 or len(token) > 16384:
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    issuer = claims.get("iss")
    return issuer if isinstance(issuer, str) else None


class JwtIssuer:
    """One configured issuer: verifies its tokens (blocking: run on a thread; fetches keys on first use)."""

    def __init__(self, config: JwtAuthenticator, timeout_s: float = 5.0, clock=time.time) -> None:
        self.config = config
        self.url = config.issuer.url
        self.timeout_s = timeout_s
        self._clock = clock
        self._ssl = ssl.create_default_context(cadata=config.issuer.certificate_authority or None)
        self._keys: Any = None  # a jwt.PyJWKClient, once discovery has answered

    def _key_client(self) -> Any:
        if self._keys is not None:
            return self._keys
        import jwt

        discovery = self.config.issuer.discovery_url or self.url.rstrip("/") + DISCOVERY_PATH
        try:
            response = httpx.get(discovery, verify=self._ssl, timeout=self.timeout_s, follow_redirects=False)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise IssuerUnavailable(f"the discovery document {discovery}: {type(exc).__name__}: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("jwks_uri"), str):
            raise IssuerUnavailable(f"the discovery document {discovery} names no jwks_uri")
        if document.get("issuer") != self.url:
            raise IssuerUnavailable(f"the discovery document {discovery} is for issuer "
                                    f"{errors.excerpt(document.get('issuer'))}, not {self.url}")
        # Keys kept 5 min; a key id not among them fetches again at most once per 30 s, so tokens
        # with made-up key ids cannot make the router hammer the issuer.
        self._keys = jwt.PyJWKClient(document["jwks_uri"], cache_jwk_set=True, lifespan=300, cooldown_duration=30,
                                     timeout=self.timeout_s, ssl_context=self._ssl)
        return self._keys

    def who(self, token: str) -> Identity | Refusal:
        import jwt

        try:
            key = self._key_client().get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError as exc:
            raise IssuerUnavailable(f"the keys of {self.url}: {exc}") from None
        except jwt.PyJWKClientError as exc:
            return Refusal(f"no signing key of {self.url} matches the token ({exc})")
        except jwt.PyJWTError as exc:
            return Refusal(f"not a token of {self.url} ({exc})")
        try:
            claims = jwt.decode(token, key, algorithms=list(ALGORITHMS), audience=self.config.issuer.audiences,
                                issuer=self.url, leeway=LEEWAY_S, options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            return Refusal(f"the token of {self.url} has expired")
        except jwt.InvalidAudienceError:
            return Refusal(f"the token of {self.url} is not made for {', '.join(self.config.issuer.audiences)!r}")
        except jwt.PyJWTError as exc:
            return Refusal(f"the token of {self.url} does not verify ({exc})")
        return self._identity(claims)

    def _identity(self, claims: dict[str, Any]) -> Identity | Refusal:
        mappings = self.config.claim_mappings
        for rule in self.config.claim_validation_rules:
            if claims.get(rule.claim) != rule.required_value:
                return Refusal(f"the token's claim {rule.claim!r} is not the value {self.url} requires")
        username = claims.get(mappings.username.claim)
        if not isinstance(username, str) or not username:
            return Refusal(f"the token has no {mappings.username.claim!r} claim to name its caller")
        if mappings.username.claim == "email" and claims.get("email_verified", True) is not True:
            return Refusal("the token's email is not verified (email_verified)")  # as the API server requires
        groups: tuple[str, ...] = ()
        if mappings.groups is not None:
            found = claims.get(mappings.groups.claim, [])
            values = [found] if isinstance(found, str) else found if isinstance(found, list) else []
            groups = tuple(mappings.groups.prefix + g for g in values if isinstance(g, str))
        uid = claims.get(mappings.uid.claim, "") if mappings.uid is not None else ""
        return Identity(mappings.username.prefix + username, uid if isinstance(uid, str) else "",
                        groups + ("system:authenticated",), float(claims["exp"]))


class JwtIssuers:
    """The configured issuers, by URL."""

    def __init__(self, configs: tuple[JwtAuthenticator, ...], timeout_s: float = 5.0) -> None:
        self._by_url = {config.issuer.url: JwtIssuer(config, timeout_s) for config in configs}

    def __bool__(self) -> bool:
        return bool(self._by_url)

    def issuer_for(self, token: str) -> JwtIssuer | None:
        """The issuer that verifies `token` (by the ``iss`` it claims); None: none of these."""
        if not self._by_url:
            return None
        claimed = unverified_issuer(token)
        return self._by_url.get(claimed) if claimed is not None else None
