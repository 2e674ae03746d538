"""``oci://`` pulled by the worker (image volumes off): an image or artifact into the source cache, through oras.

Where the pool has image volumes off (``workers.sources.oci.imageVolumes:
false``), the kubelet pulls nothing, so the worker pulls the image once into
its content-keyed cache, like any other remote source. The manifest's digest
is the cache key: a tag is resolved to its digest first (the digest is the
sha256 of the manifest's bytes, computed here, and checked against the one an
``@sha256:`` URI names), so a re-pushed tag is a new entry and the same
image under another name or from a mirror is a hit. A URI that names its
digest loads from the cache with no request at all (``known_key``).

The model's files are the image's root. A layer with an
``org.opencontainers.image.title`` annotation is an ORAS artifact's file,
written under that name (``io.deis.oras.content.unpack``: a folder oras packed
as tar+gzip, unpacked under it); a layer without one is an image layer,
applied in order (``oci_layers``). Each blob is checked against its digest
while it streams. An image index (several platforms) is refused: a model has
one set of files, so the URI names one manifest.

oras-py does the registry protocol (manifest and blob URLs, bearer-token and
basic authentication); three of its defaults are set aside here, each for a
reason: its retry decorator backs off for minutes on a refused connection
(a load has its own deadline and must fail promptly, naming the registry), its
session has no timeout, and its credential loading reads the machine's
``~/.docker/config.json`` (a pod uses only the Secret its model names). The
registry is reached over https, or plain http where the pool's source policy
spells it out as ``http://host:port`` (``SourceSettings.oci_plain_http``).
"""
from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass
from http.cookiejar import DefaultCookiePolicy
from pathlib import Path
from typing import Any

import requests

from hotset_common import errors
from hotset_common.sources import DOCKER_CONFIG_KEYS, OciImage, oci_origin
from hotset_common.spec import SourceOptions
from hotset_worker.sources import credentials as credentials_module
from hotset_worker.sources import oci_layers
from hotset_worker.sources.archive import CHUNK_BYTES, inside
from hotset_worker.sources.cache import Progress
from hotset_worker.sources.plan import FetchPlan, SourceSettings, content_key

TITLE = "org.opencontainers.image.title"
UNPACK = "io.deis.oras.content.unpack"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
TIMEOUT_S = (10.0, 60.0)  # connect, read (between bytes)
BLOB_NAME = ".oci-blob"  # a layer being downloaded, inside the fill's folder; removed once applied


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    media_type: str
    title: str  # '' for an image layer
    unpack: bool


def known_key(image: OciImage) -> str | None:
    """The cache key without asking the registry, when the URI names the manifest's digest."""
    return content_key("oci", image.digest) if image.digest else None


def plan(uri: str, image: OciImage, options: SourceOptions, settings: SourceSettings,
         credentials: credentials_module.Credentials) -> FetchPlan:
    secret = credentials.lookup(options.namespace, options.secret_name, DOCKER_CONFIG_KEYS, uri)
    config = secret.get(DOCKER_CONFIG_KEYS[0], "")
    auth = _basic_auth(uri, image, config)
    origin = oci_origin(image, settings.oci_plain_http)
    client = _client(uri, image, origin, auth, _refusal_hint(options, image, bool(config), auth is not None))
    digest, layers = _resolve(uri, image, origin, client)

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        for layer in layers:
            if time.monotonic() > deadline:
                raise errors.ModelLoadFailed(f"source {uri!r}: the load's deadline passed before layer {layer.digest} "
                                             "was pulled; nothing was kept")
            _pull_layer(uri, image, origin, client, layer, folder, progress, deadline)

    kind = "artifact" if all(layer.title for layer in layers) else "image"
    return FetchPlan(key=content_key("oci", digest), total_bytes=sum(layer.size for layer in layers), fill=fill,
                     scheme="oci", describe=f"{kind} {image.registry}/{image.repository}@{digest[:19]} "
                                            f"({len(layers)} layers) from {origin}")


# ----- the client -------------------------------------------------------------


def _client(uri: str, image: OciImage, origin: str, auth: tuple[str, str] | None, refusal: str) -> Any:
    """An oras Registry for `origin`: its auth scheme (bearer token or basic) picked from the
    registry's own answer to ``GET /v2/`` (the distribution API's ping), which also tells
    promptly whether the registry is there at all. `refusal` ends the message of a 401 or 403
    (``_refusal_hint``), kept on the client for every request it makes."""
    import oras.provider

    class Registry(oras.provider.Registry):
        do_request = oras.provider.Registry.do_request.__wrapped__  # without oras's minutes-long retries

    session = _Session()
    ping = _ping(uri, image, origin, session)
    basic = ping.status_code == 401 and ping.headers.get("Www-Authenticate", "").lower().startswith("basic")
    if basic and auth is None:  # a bearer challenge may still hand out an anonymous token
        raise _refused(uri, image, origin, 401, refusal)
    client = Registry(hostname=image.registry, insecure=origin.startswith("http://"),
                      auth_backend="basic" if basic else "token")
    client.refusal = refusal
    client.session = client.auth.session = session
    if basic:
        client.auth._basic_auth = None  # its constructor reads ORAS_USER/ORAS_PASS; a pod uses its Secret only
    if auth is not None:
        client.auth.set_basic_auth(*auth)
    return client


class _Session(requests.Session):
    """Every call with a timeout (oras passes none), no cookies (as oras's own session), and
    nothing of the machine's (proxies, netrc)."""

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False
        self.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))

    def request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs.setdefault("timeout", TIMEOUT_S)
        return super().request(*args, **kwargs)


def _ping(uri: str, image: OciImage, origin: str, session: requests.Session) -> requests.Response:
    try:
        return session.get(f"{origin}/v2/")
    except requests.RequestException as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: cannot reach registry {image.registry} at {origin} "
                                     f"({type(exc).__name__}: {str(exc)[:160]})") from exc


def _request(uri: str, image: OciImage, origin: str, client: Any, url: str, **kwargs: Any) -> Any:
    try:
        return client.do_request(url, "GET", **kwargs)
    except requests.RequestException as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: cannot reach registry {image.registry} at {origin} "
                                     f"({type(exc).__name__}: {str(exc)[:160]})") from exc
    except ValueError as exc:  # oras: "Cannot respond to request for authentication."
        raise _refused(uri, image, origin, 401, client.refusal) from exc


def _basic_auth(uri: str, image: OciImage, config: str) -> tuple[str, str] | None:
    """The username and password for `image`'s registry in a ``.dockerconfigjson`` (None: anonymous)."""
    if not config:
        return None
    try:
        auths = json.loads(config).get("auths", {})
    except (ValueError, AttributeError) as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: the Secret's .dockerconfigjson is not JSON ({exc})") from exc
    for host, entry in auths.items():
        if _registry_host(host) != image.registry.lower() or not isinstance(entry, dict):
            continue
        if entry.get("username"):
            return str(entry["username"]), str(entry.get("password", ""))
        if entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return user, password
    return None


def _refusal_hint(options: SourceOptions, image: OciImage, configured: bool, matched: bool) -> str:
    """What a refusal (401, 403) says to do, from what the pull had: no Secret, a Secret without an
    entry for this registry, or credentials the registry refused."""
    secret = f"Secret {options.secret_name!r}" if options.secret_name else \
        "the namespace's default Secret (its hotset.io/source-secret annotation)"
    if matched:
        return f" with the credentials of {secret} (its .dockerconfigjson entry for {image.registry}): check them"
    if configured:
        return f": the .dockerconfigjson of {secret} has no entry for registry {image.registry}"
    return ": name a Secret (source.secretName) holding a .dockerconfigjson with credentials for it"


def _registry_host(key: str) -> str:
    """``https://registry.example.com/v1/`` -> ``registry.example.com`` (docker config keys vary)."""
    return key.lower().split("://", 1)[-1].split("/", 1)[0]


# ----- the manifest -----------------------------------------------------------


def _resolve(uri: str, image: OciImage, origin: str, client: Any) -> tuple[str, list[Layer]]:
    """The manifest's digest (sha256 of its bytes) and its layers."""
    reference = image.digest or image.tag
    url = f"{origin}/v2/{image.repository}/manifests/{reference}"
    response = _request(uri, image, origin, client, url,
                        headers={"Accept": ", ".join(MANIFEST_TYPES + INDEX_TYPES)})
    if response.status_code != 200:
        raise _manifest_error(uri, image, origin, response, client.refusal)
    body = response.content
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if image.digest and digest != image.digest:
        raise errors.ModelLoadFailed(f"source {uri!r}: registry {image.registry} answered a manifest whose digest is "
                                     f"{digest}, not the {image.digest} the URI names")
    try:
        manifest = json.loads(body)
    except ValueError as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: the manifest from {image.registry} is not JSON") from exc
    media_type = manifest.get("mediaType") or response.headers.get("Content-Type", "")
    if media_type in INDEX_TYPES or "manifests" in manifest:
        raise errors.ModelLoadFailed(f"source {uri!r}: {image.reference} is an image index (one manifest per "
                                     "platform); name one manifest by its digest (oci://registry/repo@sha256:...)")
    layers = [_layer(uri, entry) for entry in manifest.get("layers") or []]
    if not layers:
        raise errors.ModelLoadFailed(f"source {uri!r}: image {image.reference} ({digest[:19]}) has no layers")
    return digest, layers


def _layer(uri: str, entry: dict[str, Any]) -> Layer:
    annotations = entry.get("annotations") or {}
    layer = Layer(digest=str(entry.get("digest", "")), size=int(entry.get("size") or 0),
                  media_type=str(entry.get("mediaType", "")), title=str(annotations.get(TITLE, "")),
                  unpack=str(annotations.get(UNPACK, "")).lower() == "true")
    if not layer.digest.startswith("sha256:"):
        raise errors.ModelLoadFailed(f"source {uri!r}: a layer's digest {layer.digest[:80]!r} is not sha256")
    if not layer.title and "tar" not in layer.media_type:
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {layer.digest} ({layer.media_type}) is neither an "
                                     f"image layer (tar) nor an artifact file (no {TITLE} annotation)")
    return layer


def _manifest_error(uri: str, image: OciImage, origin: str, response: Any, refusal: str) -> errors.ModelLoadFailed:
    status = response.status_code
    if status in (401, 403):
        return _refused(uri, image, origin, status, refusal)
    codes = _error_codes(response)
    if status == 404 and "NAME_UNKNOWN" in codes:
        return errors.ModelLoadFailed(f"source {uri!r}: repository {image.repository!r} does not exist on "
                                      f"registry {image.registry}")
    if status == 404:
        what = f"digest {image.digest}" if image.digest else f"tag {image.tag!r}"
        return errors.ModelLoadFailed(f"source {uri!r}: {what} not found in repository {image.repository!r} on "
                                      f"registry {image.registry} (the {what.split()[0]} or the repository does not exist)")
    return errors.ModelLoadFailed(f"source {uri!r}: registry {image.registry} answered {status} for the manifest "
                                  f"({', '.join(codes) or response.reason})")


def _refused(uri: str, image: OciImage, origin: str, status: int, refusal: str) -> errors.ModelLoadFailed:
    return errors.ModelLoadFailed(f"source {uri!r}: registry {image.registry} ({origin}) refused access ({status}){refusal}")


def _error_codes(response: Any) -> list[str]:
    try:
        return [str(error.get("code", "")) for error in response.json().get("errors", [])]
    except (ValueError, AttributeError):
        return []


# ----- the layers -------------------------------------------------------------


def _pull_layer(uri: str, image: OciImage, origin: str, client: Any, layer: Layer, folder: Path,
                progress: Progress, deadline: float) -> None:
    if layer.title and not layer.unpack:
        _download(uri, image, origin, client, layer, inside(uri, folder, layer.title), progress, deadline)
        return
    blob = folder / BLOB_NAME
    _download(uri, image, origin, client, layer, blob, progress, deadline)
    try:
        oci_layers.apply(uri, blob, inside(uri, folder, layer.title) if layer.title else folder, layer.digest)
    finally:
        blob.unlink(missing_ok=True)


def _download(uri: str, image: OciImage, origin: str, client: Any, layer: Layer, target: Path,
              progress: Progress, deadline: float) -> None:
    """Stream one blob to `target`, checking its size and digest (a mismatch fails the load)."""
    url = f"{origin}/v2/{image.repository}/blobs/{layer.digest}"
    digest, written = hashlib.sha256(), 0
    target.parent.mkdir(parents=True, exist_ok=True)
    response = _request(uri, image, origin, client, url, stream=True)
    try:
        if response.status_code in (401, 403):
            raise _refused(uri, image, origin, response.status_code, client.refusal)
        if response.status_code != 200:
            raise errors.ModelLoadFailed(f"source {uri!r}: registry {image.registry} answered {response.status_code} "
                                         f"for layer {layer.digest}")
        with open(target, "wb") as out:
            for chunk in response.iter_content(CHUNK_BYTES):
                if time.monotonic() > deadline:
                    raise errors.ModelLoadFailed(f"source {uri!r}: the load's deadline passed during layer "
                                                 f"{layer.digest}; nothing was kept")
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                progress.add(len(chunk))
    except requests.RequestException as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {layer.digest} was interrupted after {written} bytes "
                                     f"({type(exc).__name__}); nothing was kept") from exc
    finally:
        response.close()
    if "sha256:" + digest.hexdigest() != layer.digest or (layer.size and written != layer.size):
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {layer.digest} arrived as {written} bytes with digest "
                                     f"sha256:{digest.hexdigest()}; nothing was kept")
