"""Where a model's files live: the source URI schemes, parsed once for every component.

The spec validates a ServedModel's ``source`` with ``parse`` (so a typo is
refused by the API server's admission and the operator before any pod sees
it), the operator checks each location against the pool's source policy
(``endpoint_of``: which server a pod would contact), and the worker fetches
by the same parsed location. Schemes:

- ``file:///abs/path``, ``pvc://claim/path``: read in place (a folder the pod has).
- ``s3://bucket/prefix``: every object under the prefix, from any S3-compatible
  endpoint (``SourceOptions.endpoint``, else the pool's, else AWS).
- ``gs://bucket/prefix``: Google Cloud Storage through its S3 interoperability
  API (``https://storage.googleapis.com``, HMAC keys as the credentials).
- ``hf://org/name[@revision]``: a repository in the Hugging Face hub's layout,
  from the hub or a mirror (the pool's ``HF_ENDPOINT``); the revision a
  branch, tag or commit, resolved to a commit before anything is cached.
- ``oci://registry/repo:tag`` or ``oci://registry/repo@sha256:...``: an OCI
  image or artifact holding the model's files, mounted as an image volume where
  the pool has them on, else pulled by the worker into its source cache.
- ``https://host/path.tar.gz`` (also ``.tgz``, ``.tar``, ``.zip``, or a single
  file): an archive, verified against ``SourceOptions.sha256`` (required).
  ``http://`` parses too, so that a pool's policy can allow one endpoint by
  name; by default it is refused at admission.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union
from urllib.parse import unquote, urlsplit

LOCAL_SCHEMES = ("file", "pvc")
REMOTE_SCHEMES = ("s3", "gs", "hf", "oci", "https", "http")
SCHEMES = LOCAL_SCHEMES + REMOTE_SCHEMES

AWS_S3_ENDPOINT = "https://s3.amazonaws.com"
GCS_S3_ENDPOINT = "https://storage.googleapis.com"
HF_HUB_ENDPOINT = "https://huggingface.co"
DEFAULT_HF_REVISION = "main"

# S3 bucket names (3-63 lowercase letters, digits, dots, hyphens); GCS allows underscores too.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
# A hub repository id: `name` or `org/name`, letters, digits, '-', '_', '.'.
_HUB_REPO = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HUB_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
# OCI: registry host[:port], repository path components, tag or digest (the distribution spec's grammar).
_OCI_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(?::[0-9]+)?$")
_OCI_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_OCI_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_OCI_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True)
class LocalPath:
    """``file://`` or ``pvc://``: read where it is (hotset_worker.frameworks.sources resolves it)."""

    scheme: str
    rest: str


@dataclass(frozen=True)
class BucketPrefix:
    """``s3://`` or ``gs://``: every object under `prefix` in `bucket`."""

    scheme: str
    bucket: str
    prefix: str  # no leading '/', '' for the whole bucket, else ends with '/' when it names a folder

    def default_endpoint(self) -> str:
        return GCS_S3_ENDPOINT if self.scheme == "gs" else AWS_S3_ENDPOINT


@dataclass(frozen=True)
class HubRepo:
    """``hf://org/name[@revision]``."""

    repo_id: str
    revision: str  # as written; the worker resolves it to a commit


@dataclass(frozen=True)
class OciImage:
    """``oci://registry/repo:tag`` or ``@sha256:...``."""

    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @property
    def reference(self) -> str:
        """The image reference a kubelet pulls: ``registry/repo@digest`` or ``registry/repo:tag``."""
        return f"{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


@dataclass(frozen=True)
class Archive:
    """``https://`` (or ``http://``): one archive or file, checked against its sha256."""

    url: str
    scheme: str
    host: str  # host[:port] as written

    @property
    def archive_kind(self) -> str:
        """'tar' (gzip or not), 'zip', or 'file' (a single file saved under its own name)."""
        path = urlsplit(self.url).path.lower()
        if path.endswith((".tar.gz", ".tgz", ".tar")):
            return "tar"
        if path.endswith(".zip"):
            return "zip"
        return "file"

    @property
    def filename(self) -> str:
        name = unquote(urlsplit(self.url).path.rstrip("/").rsplit("/", 1)[-1])
        return name or "model"


Location = Union[LocalPath, BucketPrefix, HubRepo, OciImage, Archive]


def scheme_of(uri: str) -> str:
    return uri.partition("://")[0] if "://" in uri else ""


def parse(uri: str) -> Location:
    """The location `uri` names; ValueError says what is wrong with it, quoting it briefly."""
    scheme, sep, rest = uri.partition("://")
    shown = uri if len(uri) <= 120 else uri[:117] + "..."
    if not sep:
        raise ValueError(f"source uri {shown!r} has no scheme; expected one of {', '.join(s + '://' for s in SCHEMES)}")
    if scheme not in SCHEMES:
        raise ValueError(f"source uri scheme {scheme!r} is not supported; expected one of {SCHEMES}")
    if any(part == ".." for part in unquote(rest).split("/")):
        raise ValueError(f"source uri {shown!r} must not contain '..'")
    if not rest.strip("/"):
        raise ValueError(f"source uri {shown!r} names no path")
    if scheme in LOCAL_SCHEMES:
        return LocalPath(scheme, rest)
    if scheme in ("s3", "gs"):
        return _bucket_prefix(scheme, rest, shown)
    if scheme == "hf":
        return _hub_repo(rest, shown)
    if scheme == "oci":
        return _oci_image(rest, shown)
    return _archive(uri, scheme, shown)


def _bucket_prefix(scheme: str, rest: str, shown: str) -> BucketPrefix:
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or (scheme == "s3" and "_" in bucket):
        raise ValueError(f"source uri {shown!r}: {bucket[:70]!r} is not a valid bucket name "
                         f"(3-63 lowercase letters, digits, '.', '-')")
    return BucketPrefix(scheme, bucket, prefix)


def _hub_repo(rest: str, shown: str) -> HubRepo:
    repo_id, at, revision = rest.strip("/").partition("@")
    if not _HUB_REPO.match(repo_id) or ".." in repo_id:
        raise ValueError(f"source uri {shown!r}: {repo_id[:100]!r} is not a hub repository id (org/name)")
    if at and not _HUB_REVISION.match(revision):
        raise ValueError(f"source uri {shown!r}: revision {revision[:60]!r} is not a branch, tag or commit")
    return HubRepo(repo_id, revision or DEFAULT_HF_REVISION)


def _oci_image(rest: str, shown: str) -> OciImage:
    registry, slash, path = rest.partition("/")
    if not slash or not _OCI_REGISTRY.match(registry) or not path:
        raise ValueError(f"source uri {shown!r} must name a registry and a repository (oci://registry/repo:tag)")
    digest = tag = ""
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _OCI_DIGEST.match(digest):
            raise ValueError(f"source uri {shown!r}: digest {digest[:80]!r} is not sha256:<64 hex digits>")
    else:
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, _, tag = path.rpartition(":")
            if not _OCI_TAG.match(tag):
                raise ValueError(f"source uri {shown!r}: tag {tag[:60]!r} is not a valid tag")
        else:
            raise ValueError(f"source uri {shown!r} names no tag or digest (oci://registry/repo:tag or @sha256:...)")
    if not _OCI_REPOSITORY.match(path):
        raise ValueError(f"source uri {shown!r}: {path[:80]!r} is not a valid repository name")
    return OciImage(registry, path, tag=tag, digest=digest)


def _archive(uri: str, scheme: str, shown: str) -> Archive:
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"source uri {shown!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"source uri {shown!r} names no host")
    if parts.username or parts.password:
        raise ValueError(f"source uri {shown!r} carries credentials; name a Secret (source.secretName) instead")
    return Archive(uri, scheme, parts.netloc)


def endpoint_of(location: Location, endpoint: str = "", hf_endpoint: str = "",
                oci_pulled: bool = False) -> str | None:
    """The server (``scheme://host[:port]``) a pod contacts for `location`: what a pool's source
    policy allows or refuses. `endpoint`: the ServedModel's (or else the pool's) S3 endpoint;
    `hf_endpoint`: the pool's hub mirror; `oci_pulled`: the worker pulls oci:// images itself (image
    volumes off), over https unless the policy lists the registry as ``http://`` (``oci_origin``).
    None for what the pod reads locally or the kubelet pulls."""
    if isinstance(location, OciImage):
        return f"https://{location.registry}".lower() if oci_pulled else None
    if isinstance(location, BucketPrefix):
        return _origin(endpoint or location.default_endpoint())
    if isinstance(location, HubRepo):
        return _origin(hf_endpoint or HF_HUB_ENDPOINT)
    if isinstance(location, Archive):
        return _origin(location.url)
    return None


def _origin(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"https://{url}")
    return f"{parts.scheme}://{parts.netloc}".lower()


def endpoint_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Whether `origin` (``scheme://host[:port]``) is on `allowed`. An entry without a scheme
    allows that host over https only; ``*.example.com`` allows its subdomains; ``http://`` must be
    spelled out, so plain http is never allowed by accident. An empty list allows any https
    endpoint (and no plain http)."""
    scheme, _, host = origin.partition("://")
    if not allowed:
        return scheme == "https"
    for entry in allowed:
        want_scheme, sep, want_host = entry.lower().rstrip("/").partition("://")
        if not sep:
            want_scheme, want_host = "https", want_scheme
        if want_scheme != scheme:
            continue
        if want_host == host or (want_host.startswith("*.") and host.split(":")[0].endswith(want_host[1:])):
            return True
    return False


def plain_http_registries(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The registries (``host[:port]``) a worker pulls from over plain http: exactly those the
    pool's policy spells out as ``http://host:port`` (the operator hands them to the worker as
    ``HOTSET_OCI_PLAIN_HTTP``); every other registry is pulled over https."""
    found = []
    for entry in allowed:
        scheme, sep, host = entry.lower().rstrip("/").partition("://")
        if sep and scheme == "http" and not host.startswith("*."):
            found.append(host)
    return tuple(found)


def oci_origin(image: OciImage, plain_http: tuple[str, ...]) -> str:
    """``http://registry`` where `plain_http` lists it, else ``https://registry``."""
    scheme = "http" if image.registry.lower() in plain_http else "https"
    return f"{scheme}://{image.registry}".lower()


def oci_mount_name(image: OciImage) -> str:
    """The folder (under the pool's oci root) and volume name of `image`'s image volume: the
    operator mounts it there, the worker reads it there."""
    import hashlib

    return "oci-" + hashlib.sha256(image.reference.encode()).hexdigest()[:16]


# Source credentials: the Secret keys each scheme reads, and how the operator names them in the
# one Secret per pool namespace that worker pods mount (docs/frameworks.md, "Credentials").
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
HF_KEYS = ("HF_TOKEN",)
DOCKER_CONFIG_KEYS = (".dockerconfigjson",)  # a kubernetes.io/dockerconfigjson Secret's key, for oci:// pulls
CREDENTIAL_KEYS = AWS_KEYS + HF_KEYS + DOCKER_CONFIG_KEYS
NAMESPACE_SECRET_ANNOTATION = "hotset.io/source-secret"  # on a Namespace: its models' default Secret
NAMESPACE_DEFAULT = "_namespace"  # the key segment standing for that default


def credential_key(namespace: str, secret: str, key: str) -> str:
    """``<namespace>.<secret>.<KEY>`` (a standalone worker's files: ``<secret>.<KEY>``)."""
    return ".".join(part for part in (namespace, secret or NAMESPACE_DEFAULT, key) if part)
