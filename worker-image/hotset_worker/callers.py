"""Who may call this worker (docs/security.md, "Workers that prove who they are").

Standalone (the local stack, on loopback) a worker answers everyone, or, with ``--api-token``,
whoever sends that one token (``SharedToken``). A cluster pod (``--caller-keys``) answers only the
ServiceAccounts it is told (the router's and the operator's, ``--trusted-callers``), each
presenting a token the kubelet projected into its pod for the audience ``hotset-worker``
(``ServiceAccountCallers``):

- the token is verified here, offline: its signature against the cluster's ServiceAccount keys,
  its issuer, audience and expiry, with PyJWT. The keys and the issuer are public; the operator
  copies them from the API server's discovery endpoints into a ConfigMap the pod mounts, and the
  worker reads them again when the kubelet updates the files. So a worker pod needs no API
  access, no RBAC and no network path to the API server (which model code could use too);
- a verified token is kept until it expires (a few callers, each with a token that changes every
  few minutes): a request pays a dictionary lookup, the first of each token one signature check.

What offline verification cannot see: a token whose pod was deleted stays good until it expires
(TOKEN_SECONDS at most), where a TokenReview would refuse it at once.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from hotset_common import errors, http
from hotset_common.worker_identity import (ACCOUNT_PREFIX, CALLER_AUDIENCE, ISSUER_KEY, JWKS_KEY, KEYS_CONFIGMAP)

log = logging.getLogger(__name__)

LEEWAY_S = 10  # clock skew between the API server that signed a token and this pod
ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
MAX_KEPT = 256  # verified tokens kept (a few callers, a new token each every few minutes)
RETRY_AFTER_S = 5


class CallerCheck(Protocol):
    def check(self, headers: Mapping[str, str]) -> None:
        """Return when the request's caller may call this worker; else raise Unauthorized (401),
        Forbidden (403), or BackendUnavailable (503: it cannot check yet)."""


class SharedToken:
    """One fixed token (``--api-token``): the local stack's, on loopback."""

    def __init__(self, token: str) -> None:
        self.token = token

    def check(self, headers: Mapping[str, str]) -> None:
        http.check_bearer(headers, self.token, "this worker's API")


@dataclass(frozen=True)
class _Keys:
    issuer: str
    keys: dict[str, Any]  # kid -> PyJWK
    stamp: tuple[float, ...]  # the files' modification times when read


class IssuerKeys:
    """The cluster's ServiceAccount issuer and public keys from `folder` (the ConfigMap's files),
    read again when they change (looked at every `reread_s`) or when a token names a key id not
    known (at most once a second)."""

    def __init__(self, folder: Path, reread_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        self.reread_s = reread_s
        self._clock = clock
        self._held: _Keys | None = None
        self._looked = float("-inf")
        self._lock = threading.Lock()  # the gRPC server and the HTTP app may ask at once

    def _stamp(self) -> tuple[float, ...]:
        return tuple((self.folder / name).stat().st_mtime for name in (ISSUER_KEY, JWKS_KEY))

    def _read(self) -> _Keys:
        import jwt  # PyJWT: only cluster pods verify tokens

        stamp = self._stamp()
        issuer = (self.folder / ISSUER_KEY).read_text().strip()
        found = jwt.PyJWKSet.from_json((self.folder / JWKS_KEY).read_text())
        return _Keys(issuer, {key.key_id: key for key in found.keys if key.key_id}, stamp)

    def current(self, kid: str = "") -> _Keys:
        """The keys; re-read when changed or when `kid` is unknown. 503 when there are none to read."""
        with self._lock:
            now = self._clock()
            held = self._held
            due = now - self._looked >= self.reread_s or (held is not None and kid and kid not in held.keys
                                                          and now - self._looked >= 1.0)
            if held is None or due:
                self._looked = now
                try:
                    if held is None or self._stamp() != held.stamp or (kid and kid not in held.keys):
                        self._held = held = self._read()
                except Exception as exc:  # noqa: BLE001 - a missing or unreadable file: say so
                    if held is None:
                        raise errors.BackendUnavailable(
                            f"this worker cannot check its callers yet: no ServiceAccount keys in {self.folder} "
                            f"(the operator's ConfigMap {KEYS_CONFIGMAP}): {type(exc).__name__}: {exc}",
                            RETRY_AFTER_S) from None
                    log.warning("keeping the ServiceAccount keys read before: %s", exc)
            return held


class ServiceAccountCallers:
    """ServiceAccount tokens for `audience`, verified against `keys`, of the accounts in `trusted`
    (user names, ``system:serviceaccount:<namespace>:<name>``)."""

    def __init__(self, keys: IssuerKeys, trusted: frozenset[str], audience: str = CALLER_AUDIENCE,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not trusted:
            raise ValueError("--caller-keys needs --trusted-callers: the ServiceAccounts this worker answers")
        self.keys = keys
        self.trusted = trusted
        self.audience = audience
        self._wall = wall_clock
        self._verified: dict[str, tuple[str, float]] = {}  # token -> (its account, its expiry)
        self._lock = threading.Lock()

    def check(self, headers: Mapping[str, str]) -> None:
        token = http.bearer_token(headers)
        if not token:
            raise errors.Unauthorized(
                "this worker answers only hotset's router and operator: send 'Authorization: Bearer <token>', a "
                f"ServiceAccount token for the audience {self.audience!r} of {self._accounts()}")
        kept = self._verified.get(token)
        if kept is not None and kept[1] > self._wall():
            user = kept[0]
        else:
            user = self._verify(token)
        if user not in self.trusted:
            raise errors.Forbidden(f"{user} may not call this worker: it answers only {self._accounts()}")

    def _accounts(self) -> str:
        return ", ".join(sorted(self.trusted))

    def _verify(self, token: str) -> str:
        import jwt

        try:
            kid = jwt.get_unverified_header(token).get("kid") or ""
        except jwt.PyJWTError:
            raise errors.Unauthorized("the bearer token is not a ServiceAccount token (not a JWT)") from None
        keys = self.keys.current(kid)
        key = keys.keys.get(kid)
        if key is None:
            raise errors.Unauthorized(f"the bearer token is signed by a key this cluster's ServiceAccount issuer "
                                      f"does not publish (kid {errors.excerpt(kid)})")
        try:
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name] if key.algorithm_name else list(ALGORITHMS),
                                audience=self.audience, issuer=keys.issuer, leeway=LEEWAY_S,
                                options={"require": ["exp", "iat", "sub"]})
        except jwt.ExpiredSignatureError:
            raise errors.Unauthorized("the bearer token has expired") from None
        except jwt.InvalidAudienceError:
            raise errors.Unauthorized(f"the bearer token is not made for the audience {self.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise errors.Unauthorized(f"the bearer token is not issued by this cluster ({keys.issuer})") from None
        except jwt.PyJWTError as exc:
            raise errors.Unauthorized(f"the bearer token does not verify: {exc}") from None
        user = str(claims.get("sub", ""))
        if not user.startswith(ACCOUNT_PREFIX):
            raise errors.Unauthorized("the bearer token is not a ServiceAccount's")
        with self._lock:
            if len(self._verified) >= MAX_KEPT:
                now = self._wall()
                self._verified = {t: v for t, v in self._verified.items() if v[1] > now}
                if len(self._verified) >= MAX_KEPT:
                    self._verified.clear()
            self._verified[token] = (user, float(claims["exp"]))
        return user


def from_settings(api_token: str, caller_keys: Path | None, trusted: tuple[str, ...]) -> CallerCheck | None:
    """The worker's check from its options; None: every caller passes (standalone, loopback)."""
    if caller_keys is not None:
        return ServiceAccountCallers(IssuerKeys(caller_keys), frozenset(trusted))
    if api_token:
        return SharedToken(api_token)
    return None

