"""Turn a model's source into a local folder the framework can read.

``folder(spec, context)`` is what every framework worker calls. Local schemes
are read in place: ``file:///abs/path`` and ``pvc://claim/sub/path`` (a
PersistentVolumeClaim mounted into the pod at a folder named by
``WorkerContext.source_roots``); a source can never point outside its root,
however its path is spelled. Remote schemes (``s3://``, ``gs://``, ``hf://``,
``oci://``, ``https://``) come from the pod's source fetcher
(``hotset_worker.sources``: downloaded once into the cache, or an image volume).

``file://`` reads the pod's own filesystem. In cluster mode the worker gets
the folders a ``file://`` source may name (``WorkerContext.file_roots``,
``--file-roots``): anything else, such as the service-account token's mount
or /proc, is refused (403) after resolving symlinks. None means any path
(standalone use on one's own machine).
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Sequence
from urllib.parse import unquote

from hotset_common import errors
from hotset_common import sources as locations
from hotset_common.spec import ModelSpec

if TYPE_CHECKING:
    from hotset_worker.frameworks.base import WorkerContext


def folder(spec: ModelSpec, context: "WorkerContext") -> Path:
    """The local folder (or file) holding `spec`'s model, fetched first if its source is remote.
    Runs on a load thread: a download blocks it, never the event loop."""
    if locations.scheme_of(spec.source) in locations.LOCAL_SCHEMES:
        return resolve(spec.source, context.source_roots, context.file_roots)
    if context.fetcher is None:
        raise errors.ModelLoadFailed(f"source {spec.source!r}: this worker fetches no remote sources")
    return context.fetcher.folder(spec)


def cached_folder(spec: ModelSpec, context: "WorkerContext") -> Path | None:
    """`spec`'s folder if it can be read without downloading anything (OIP metadata of a cold
    model must not fetch it); None when it would have to be fetched."""
    if locations.scheme_of(spec.source) in locations.LOCAL_SCHEMES:
        return resolve(spec.source, context.source_roots, context.file_roots)
    return context.fetcher.cached(spec) if context.fetcher is not None else None


def immutable(spec: ModelSpec) -> bool:
    """Whether the files of `spec`'s folder stay as they are for as long as a copy of it is loaded,
    so a framework may map them into memory instead of copying them. True for remote sources: a
    source-cache entry is written once, renamed in complete and never written again (an eviction
    removes it, a new fetch makes a new folder), and the fetcher holds a lease on it while the
    manager holds the copy, so it is never evicted under the mapping (sources/cache.py); an image
    volume is a read-only mount. False for ``file://`` and ``pvc://``: those folders belong to
    their users, who may rewrite a file in place, and a mapped file that shrinks is a SIGBUS."""
    return locations.scheme_of(spec.source) not in locations.LOCAL_SCHEMES


def resolve(uri: str, source_roots: dict[str, Path], file_roots: Sequence[Path] | None) -> Path:
    """Return the existing local path of `uri`; ModelLoadFailed names what is wrong, Forbidden
    a ``file://`` path outside `file_roots` (None: any path). `file_roots` has no default on
    purpose: every framework passes its context's, so none can skip the restriction (vLLM's
    sources once did, and named any folder of the pod)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise errors.ModelLoadFailed(f"source {uri!r} has no scheme; expected file:// or pvc://")
    rest = unquote(rest)
    if scheme == "file":
        path = _file_path(uri, rest)
        if file_roots is not None:
            _refuse_outside(uri, path, file_roots)
    elif scheme == "pvc":
        path = _pvc_path(uri, rest, source_roots)
    else:
        raise errors.ModelLoadFailed(f"source scheme {scheme!r} of {uri!r} is not a local one (file://, pvc://)")
    if not path.exists():
        raise errors.ModelLoadFailed(f"model source {uri!r} not found: {path} does not exist")
    return path


def _refuse_traversal(uri: str, relative: str) -> PurePosixPath:
    parts = PurePosixPath(relative).parts
    if ".." in parts:
        raise errors.ModelLoadFailed(f"source {uri!r} must not contain '..'")
    return PurePosixPath(*[p for p in parts if p not in ("/", ".")]) if parts else PurePosixPath()


def _file_path(uri: str, rest: str) -> Path:
    # file:///abs/path -> rest "/abs/path"; file://localhost/abs/path is also standard.
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    if not rest.startswith("/"):
        raise errors.ModelLoadFailed(f"file source {uri!r} must be an absolute path (file:///abs/path)")
    _refuse_traversal(uri, rest)
    return Path(rest)


def _refuse_outside(uri: str, path: Path, file_roots: Sequence[Path]) -> None:
    """A file:// source must resolve (symlinks followed) inside one of the declared roots."""
    real = path.resolve()
    for root in file_roots:
        root = Path(root).resolve()
        if real == root or root in real.parents:
            return
    allowed = ", ".join(str(root) for root in file_roots) or "none (use pvc:// sources)"
    raise errors.Forbidden(f"source {uri!r} is outside the folders this worker may read file:// sources from: {allowed}")


def _pvc_path(uri: str, rest: str, source_roots: dict[str, Path]) -> Path:
    claim, _, sub = rest.partition("/")
    if not claim:
        raise errors.ModelLoadFailed(f"pvc source {uri!r} names no claim (pvc://claim/path)")
    root = source_roots.get(claim)
    if root is None:
        known = ", ".join(sorted(source_roots)) or "none"
        raise errors.ModelLoadFailed(f"pvc claim {claim!r} of {uri!r} is not mounted in this pod (mounted: {known})")
    relative = _refuse_traversal(uri, sub)
    root = Path(root).resolve()
    path = (root / relative).resolve()
    # Symlinks inside the volume must not lead out of it either.
    if path != root and root not in path.parents:
        raise errors.ModelLoadFailed(f"source {uri!r} resolves outside its volume {root}")
    return path
