"""``https://`` archives: one download, checked against the sha256 the ServedModel declares.

The sha256 is required (the spec refuses an archive without one), and it is
the cache key: the same archive from another mirror is a hit. The archive is
streamed to the fill's folder while it is hashed; only a matching digest is
unpacked (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``; anything else is kept as
one file under its own name). Unpacking writes regular files and folders
only, each inside the folder: an absolute name, ``..``, a link or a device in
the archive fails the load. Redirects are followed only to https.
"""
from __future__ import annotations

import hashlib
import tarfile
import time
import zipfile
from pathlib import Path, PurePosixPath

from hotset_common import errors
from hotset_common.sources import Archive
from hotset_common.spec import SourceOptions
from hotset_worker.sources.cache import Progress
from hotset_worker.sources.plan import FetchPlan, content_key

CHUNK_BYTES = 1 << 20
DOWNLOAD_NAME = ".download"


def known_key(options: SourceOptions) -> str:
    """The cache key, known without asking the server: a cached archive loads with no request."""
    return content_key("sha256", options.sha256)


def plan(uri: str, location: Archive, options: SourceOptions) -> FetchPlan:
    expected = options.sha256
    size = _declared_size(uri, location)

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        download = folder / DOWNLOAD_NAME
        digest = _download(uri, location, download, progress, deadline)
        if digest != expected:
            raise errors.ModelLoadFailed(f"source {uri!r}: sha256 mismatch: the download is {digest}, source.sha256 "
                                         f"says {expected}; nothing was kept")
        _unpack(uri, location, download, folder)

    return FetchPlan(key=known_key(options), total_bytes=size, fill=fill, scheme=location.scheme,
                     describe=f"archive of {size} bytes")


def _client():  # noqa: ANN202 - httpx.Client
    import httpx

    return httpx.Client(timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=False, trust_env=False)


def _follow(client, method: str, uri: str, url: str, stream: bool = False):  # noqa: ANN001, ANN202
    """Send, following at most 5 redirects and only to https (a redirect must not leave TLS)."""
    for _ in range(6):
        request = client.build_request(method, url)
        response = client.send(request, stream=stream)
        if not response.is_redirect:
            return response
        target = str(response.next_request.url) if response.next_request is not None else ""
        response.close()
        if not target.startswith("https://"):
            raise errors.ModelLoadFailed(f"source {uri!r}: redirected to {target[:100]!r}, which is not https")
        url = target
    raise errors.ModelLoadFailed(f"source {uri!r}: more than 5 redirects")


def _declared_size(uri: str, location: Archive) -> int:
    """Content-Length from a HEAD, for progress and the cache's room (0 when not told)."""
    import httpx

    try:
        with _client() as client:
            response = _follow(client, "HEAD", uri, location.url)
    except httpx.HTTPError as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: cannot reach {location.host}: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 404:
        raise errors.ModelLoadFailed(f"source {uri!r}: not found (404 from {location.host})")
    if response.status_code in (401, 403):
        raise errors.ModelLoadFailed(f"source {uri!r}: access refused ({response.status_code} from {location.host})")
    if response.status_code >= 400 and response.status_code != 405:
        raise errors.ModelLoadFailed(f"source {uri!r}: {location.host} answered {response.status_code}")
    try:
        return int(response.headers.get("content-length", "0"))
    except ValueError:
        return 0


def _download(uri: str, location: Archive, target: Path, progress: Progress, deadline: float) -> str:
    import httpx

    digest = hashlib.sha256()
    written = 0
    try:
        with _client() as client:
            response = _follow(client, "GET", uri, location.url, stream=True)
            try:
                if response.status_code >= 400:
                    raise errors.ModelLoadFailed(f"source {uri!r}: {location.host} answered {response.status_code}")
                declared = int(response.headers.get("content-length", "0") or 0)
                with open(target, "wb") as out:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        if time.monotonic() > deadline:
                            raise errors.ModelLoadFailed(
                                f"source {uri!r}: the load's deadline passed after {written} bytes of the archive; "
                                "nothing was kept")
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        progress.add(len(chunk))
            finally:
                response.close()
    except httpx.HTTPError as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: the download was interrupted after {written} bytes "
                                     f"({type(exc).__name__}: {str(exc)[:120]}); nothing was kept") from exc
    if declared and written != declared:
        raise errors.ModelLoadFailed(f"source {uri!r}: truncated download: {written} of {declared} bytes; nothing was kept")
    return digest.hexdigest()


def inside(uri: str, folder: Path, name: str) -> Path:
    """`name` (an archive or layer member) under `folder`; a load failure naming it if it would
    land outside (absolute, ``..``, a drive). Shared with oci:// layers (``oci_layers``)."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or name.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise errors.ModelLoadFailed(f"source {uri!r}: archive member {name[:120]!r} would be written outside the "
                                     "model's folder; refused")
    return folder.joinpath(*[p for p in parts if p not in ("", ".")])


def _unpack(uri: str, location: Archive, download: Path, folder: Path) -> None:
    kind = location.archive_kind
    try:
        if kind == "tar":
            _untar(uri, download, folder)
        elif kind == "zip":
            _unzip(uri, download, folder)
        else:
            download.rename(inside(uri, folder, location.filename))
            return
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: the archive does not unpack ({type(exc).__name__}: {exc})") from exc
    download.unlink()


def _untar(uri: str, download: Path, folder: Path) -> None:
    with tarfile.open(download, "r:*") as archive:
        for member in archive:
            target = inside(uri, folder, member.name)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None
                with source, open(target, "wb") as out:
                    while chunk := source.read(CHUNK_BYTES):
                        out.write(chunk)
            else:
                raise errors.ModelLoadFailed(f"source {uri!r}: archive member {member.name[:120]!r} is a link or "
                                             "device; only files and folders are unpacked")


def _unzip(uri: str, download: Path, folder: Path) -> None:
    with zipfile.ZipFile(download) as archive:
        for info in archive.infolist():
            target = inside(uri, folder, info.filename)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise errors.ModelLoadFailed(f"source {uri!r}: archive member {info.filename[:120]!r} is a link; "
                                             "only files and folders are unpacked")
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, open(target, "wb") as out:
                while chunk := source.read(CHUNK_BYTES):
                    out.write(chunk)
