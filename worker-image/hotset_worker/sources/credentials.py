"""Source credentials: read from files a Secret volume holds, never from the model's spec.

The operator gathers the Secrets that a pool's ServedModels name (``spec.source.secretName``,
else their namespace's ``hotset.io/source-secret`` annotation) into one Secret per pool
namespace and mounts it read-only into the worker; each key is
``<namespace>.<secret>.<KEY>`` (``_namespace`` stands for a namespace's default secret). A
standalone worker reads ``<secret>.<KEY>`` files (``_namespace.<KEY>``: its default) from ``--source-credentials``. Files are
read on each fetch, so a rotated Secret is used from the kubelet's next volume refresh on.
"""
from __future__ import annotations

from pathlib import Path

from hotset_common import errors
from hotset_common.sources import AWS_KEYS, HF_KEYS, credential_key

__all__ = ["AWS_KEYS", "HF_KEYS", "Credentials"]


class Credentials:
    def __init__(self, folder: Path | None) -> None:
        self.folder = Path(folder) if folder else None

    def lookup(self, namespace: str, secret: str, keys: tuple[str, ...], uri: str) -> dict[str, str]:
        """The `keys` present in the Secret a source names (`secret`; empty: its namespace's
        default, if any). A named Secret that is not there is an error naming it; no Secret named
        and no namespace default means anonymous access ({})."""
        named = bool(secret)
        found = self._read(namespace, secret, keys)
        if named and not found:
            where = f"{namespace}/{secret}" if namespace else secret
            raise errors.ModelLoadFailed(
                f"source {uri!r}: Secret {where!r} (source.secretName) holds none of {', '.join(keys)}, or is not "
                "available to this pod (the operator copies it into the pool's credentials Secret; see its events)")
        return found

    def _read(self, namespace: str, secret: str, keys: tuple[str, ...]) -> dict[str, str]:
        if self.folder is None:
            return {}
        found = {}
        for key in keys:
            path = self.folder / credential_key(namespace, secret, key)
            try:
                found[key] = path.read_text().strip()
            except (FileNotFoundError, NotADirectoryError):
                continue
        return {k: v for k, v in found.items() if v}
