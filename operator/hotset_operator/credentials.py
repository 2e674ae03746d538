"""Source credentials for worker pods: the Secrets a pool's models name, gathered into one Secret.

Worker pods never call the API server (no token in them), and a pod can
mount only Secrets of its own namespace, while the shared pool serves models
of many. So the operator copies, for each pool namespace, the credential keys
(``hotset_common.sources.CREDENTIAL_KEYS``, nothing else) of every Secret its
models name (``spec.source.secretName``, else their namespace's
``hotset.io/source-secret`` annotation) into one Secret,
``config.source_credentials_secret``, keyed ``<namespace>.<secret>.<KEY>``; the
pods mount it and read it on each fetch (the kubelet refreshes it, so a rotated
Secret needs no restart). A model can only name Secrets of its own namespace.
In shared pool mode every pool pod can read every served namespace's copied
keys: use ``workers.pool.mode: namespace`` where tenants must not share them
(docs/security.md).

Reads are cached for ``ttl_s``, so a pass every few seconds costs one read
per named Secret per TTL, not per pass.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol, Sequence

from hotset_common import labels
from hotset_common import sources as locations
from hotset_common.spec import ModelSpec, with_variants
from hotset_operator.config import OperatorConfig

MANAGER = "hotset-operator"


class SecretReader(Protocol):
    def secret_data(self, namespace: str, name: str) -> dict[str, str] | None: ...

    def namespace_annotations(self, namespace: str) -> dict[str, str]: ...


def referenced(specs: Iterable[ModelSpec]) -> list[tuple[str, str]]:
    """(namespace, secretName or '') of every remote source in `specs` (and their canaries)."""
    found = set()
    for spec in with_variants(list(specs)):
        if locations.scheme_of(spec.source) in ("s3", "gs", "hf", "https", "http") and spec.source_options.namespace:
            found.add((spec.source_options.namespace, spec.source_options.secret_name))
    return sorted(found)


class CredentialGatherer:
    def __init__(self, reader: SecretReader, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    def _cached(self, key: tuple[str, str], read: Callable[[], Any]) -> Any:
        hit = self._cache.get(key)
        if hit is not None and self.clock() - hit[0] < self.ttl_s:
            return hit[1]
        value = read()
        self._cache[key] = (self.clock(), value)
        return value

    def data(self, specs: Iterable[ModelSpec]) -> dict[str, str]:
        """The credentials Secret's ``data`` (base64, as read) for `specs`."""
        data: dict[str, str] = {}
        for namespace, secret in referenced(specs):
            name = secret or self._cached(("ns", namespace), lambda: self.reader.namespace_annotations(namespace)).get(
                locations.NAMESPACE_SECRET_ANNOTATION, "")
            if not name:
                continue  # anonymous access
            found = self._cached((namespace, name), lambda: self.reader.secret_data(namespace, name)) or {}
            for key in locations.CREDENTIAL_KEYS:
                if key in found:
                    data[locations.credential_key(namespace, secret, key)] = found[key]
        return data


def build_credentials_secret(config: OperatorConfig, namespace: str, data: dict[str, str],
                             owners: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": config.source_credentials_secret, "namespace": namespace,
                                "labels": {labels.PART_OF: labels.PROJECT, labels.MANAGED_BY: MANAGER}}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata, "data": dict(sorted(data.items()))}
