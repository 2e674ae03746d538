"""What a namespace's worker pods need from the models they serve, kept as models come and go.

A pool's pods carry the Triton sidecar while a Triton model is among its
models (``workers.triton.sidecar: auto``), an image volume per oci://
source, and the credentials Secret gathered from the Secrets its models
name (``credentials.py``). Walking every model of a pool on each pool pass
to decide that would cost the catalog's size every few seconds; instead the
reconciler tells this what each accepted model is as it publishes it, and a
pass reads a count and the few models that have an oci:// source or name
credentials. Each namespace also has a version, bumped when a model that may
name credentials comes, changes or goes, so its credentials are gathered
again only then (or when their reads expire).

Namespaces are where the pods run: a shared model counts in its pool's
namespace, a dedicated one in its own.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hotset_common import sources as locations
from hotset_common.spec import Framework, ModelSpec
from hotset_operator import credentials, workloads


@dataclass
class _Namespace:
    triton: set[str]  # shared Triton models (the pool's sidecar, auto)
    images: dict[str, ModelSpec]  # models with an oci:// source (or canary), shared and dedicated
    credentials: dict[str, ModelSpec]  # models whose remote sources may name a Secret
    version: int = 0


class PoolContents:
    def __init__(self) -> None:
        self._namespaces: dict[str, _Namespace] = defaultdict(lambda: _Namespace(set(), {}, {}))
        self._held: dict[str, tuple[str, bool, ModelSpec]] = {}  # "<ns>/<model>" -> (namespace, shared, spec)

    def put(self, namespace: str, model: str, spec: ModelSpec, shared: bool) -> None:
        """`model` (`spec`) is served by `namespace`'s pods (its pool's when `shared`)."""
        key = f"{namespace}/{model}"
        held = self._held.get(key)
        if held is not None and held == (namespace, shared, spec):
            return
        self._drop(namespace, model)
        found = self._namespaces[namespace]
        if shared and spec.framework is Framework.TRITON:
            found.triton.add(model)
        if workloads.oci_images([spec]):
            found.images[model] = spec
        if credentials.referenced([spec]):
            found.credentials[model] = spec
            found.version += 1
        self._held[key] = (namespace, shared, spec)

    def remove(self, namespace: str, model: str) -> None:
        self._drop(namespace, model)

    def _drop(self, namespace: str, model: str) -> None:
        if self._held.pop(f"{namespace}/{model}", None) is None:
            return
        found = self._namespaces[namespace]
        found.triton.discard(model)
        found.images.pop(model, None)
        if found.credentials.pop(model, None) is not None:
            found.version += 1

    def serves_triton(self, namespace: str) -> bool:
        """Whether a shared Triton model is among the pool's models in `namespace`."""
        found = self._namespaces.get(namespace)
        return found is not None and bool(found.triton)

    def images(self, namespace: str) -> list[locations.OciImage]:
        """The oci:// sources of `namespace`'s shared models (the pool's image volumes)."""
        found = self._namespaces.get(namespace)
        if found is None:
            return []
        return workloads.oci_images(spec for model, spec in found.images.items()
                                    if self._held[f"{namespace}/{model}"][1])

    def credential_specs(self, namespace: str) -> list[ModelSpec]:
        """The models, shared and dedicated, whose sources may name Secrets for `namespace`'s pods."""
        found = self._namespaces.get(namespace)
        return [] if found is None else list(found.credentials.values())

    def version(self, namespace: str) -> int:
        found = self._namespaces.get(namespace)
        return 0 if found is None else found.version
