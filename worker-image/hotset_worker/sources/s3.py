"""``s3://bucket/prefix`` and ``gs://bucket/prefix``: every object under a prefix, through boto3.

Any S3-compatible server works (MinIO, SeaweedFS, Ceph, Google Cloud Storage's
interoperability API): the endpoint, region and addressing style come from the
ServedModel's ``source`` or else the pool's settings. Credentials come only
from the Secret the source names (``credentials.AWS_KEYS``); without one the
requests go unsigned. boto3's own credential chain (environment, ~/.aws, the
instance metadata service) is never consulted, so a pod never signs with, or
asks for, credentials nobody gave it.

The cache key is the listing itself (each object's key, ETag and size): an
unchanged prefix is a cache hit without a byte downloaded, a changed object a
new entry. Each object is fetched with ``If-Match`` on its listed ETag: an
object replaced after the listing fails the load, naming it, instead of mixing
versions, so an entry holds only the versions its key names. (One GET is of
one version: S3 serves the version it started with to the end, and MinIO
holds an overwrite until the GETs in progress end.) Each object is checked
against its listed size, and against its MD5 where the ETag is one.
"""
from __future__ import annotations

import functools
import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hotset_common import errors
from hotset_common.sources import BucketPrefix
from hotset_common.spec import SourceOptions
from hotset_worker.sources import credentials as credentials_module
from hotset_worker.sources.cache import Progress
from hotset_worker.sources.plan import FetchPlan, SourceSettings, content_key

CHUNK_BYTES = 1 << 20
CLIENTS_KEPT = 16  # boto3 clients kept for reuse (_client_for)
_MD5_ETAG = re.compile(r'^"?([0-9a-f]{32})"?$')


@dataclass(frozen=True)
class _Object:
    key: str
    relative: str
    etag: str
    size: int


def plan(uri: str, location: BucketPrefix, options: SourceOptions, settings: SourceSettings,
         credentials: credentials_module.Credentials) -> FetchPlan:
    endpoint = options.endpoint or settings.s3_endpoint or location.default_endpoint()
    if location.scheme == "gs" and not options.endpoint:
        endpoint = location.default_endpoint()  # the pool's S3 endpoint is not Google's
    client = _client(uri, endpoint, options, settings, credentials)
    objects = _list(client, uri, location, endpoint)
    total = sum(obj.size for obj in objects)
    key = content_key(location.scheme, endpoint, location.bucket,
                      *(f"{obj.relative}\0{obj.etag}\0{obj.size}" for obj in objects))

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        for obj in objects:
            _download(client, uri, location.bucket, obj, folder, progress, deadline, endpoint)

    return FetchPlan(key=key, total_bytes=total, fill=fill, scheme=location.scheme,
                     describe=f"{len(objects)} objects from {endpoint}")


def _client(uri: str, endpoint: str, options: SourceOptions, settings: SourceSettings,
            credentials: credentials_module.Credentials) -> Any:
    secret = credentials.lookup(options.namespace, options.secret_name, credentials_module.AWS_KEYS, uri)
    path_style = options.path_style if options.path_style is not None else settings.s3_path_style
    region = options.region or settings.s3_region or "us-east-1"
    return _client_for(endpoint, region, path_style, tuple(sorted(secret.items())))


@functools.lru_cache(maxsize=CLIENTS_KEPT)
def _client_for(endpoint: str, region: str, path_style: bool, secret: tuple[tuple[str, str], ...]) -> Any:
    """One boto3 client per endpoint, region, addressing style and credentials, kept for the next
    fetch: building one parses botocore's service model (about 0.1 s of CPU, held GIL included),
    which a cached load, whose only request is the listing, would otherwise pay each time. boto3's
    clients are thread-safe. The credentials are part of the key, so a rotated Secret (read again
    on each fetch) gets a client of its own; the old one ages out of the cache."""
    import boto3
    import botocore
    from botocore.config import Config

    keys = dict(secret)
    config = Config(
        s3={"addressing_style": "path" if path_style else "virtual"},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10, read_timeout=60,
        signature_version=None if keys else botocore.UNSIGNED,
        # Checksums only where the operation needs them: S3-compatible servers differ in support.
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
    )
    session = boto3.session.Session(
        aws_access_key_id=keys.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=keys.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=keys.get("AWS_SESSION_TOKEN"),
        region_name=region,
    )
    # Unsigned without a Secret: botocore then runs no credential provider (environment, files, the
    # instance metadata service); with one, the Secret's keys are the only credentials.
    return session.client("s3", endpoint_url=endpoint, config=config)


def _list(client: Any, uri: str, location: BucketPrefix, endpoint: str) -> list[_Object]:
    """The objects the source names: the object `prefix` itself, else everything under `prefix/`."""
    prefix = location.prefix
    folder = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    found: list[_Object] = []
    try:
        if prefix and not prefix.endswith("/"):
            single = _head(client, location.bucket, prefix)
            if single is not None:
                name = PurePosixPath(prefix).name
                return [_Object(prefix, name, single["ETag"], int(single["ContentLength"]))]
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=location.bucket, Prefix=folder):
            for item in page.get("Contents", []):
                relative = item["Key"][len(folder):]
                if not relative or relative.endswith("/"):
                    continue  # a "folder" placeholder object
                found.append(_Object(item["Key"], _safe_relative(uri, relative), item["ETag"], int(item["Size"])))
    except errors.HotsetError:
        raise
    except Exception as exc:  # noqa: BLE001 - every client failure becomes a load failure naming it
        raise _explain(exc, uri, endpoint, location.bucket, folder) from exc
    if not found:
        raise errors.ModelLoadFailed(f"source {uri!r}: no objects under s3 prefix {folder or '/'!r} of bucket "
                                     f"{location.bucket!r} at {endpoint}")
    return sorted(found, key=lambda obj: obj.relative)


def _head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _safe_relative(uri: str, relative: str) -> str:
    """An object key below the prefix as a relative path; a key that would leave the folder
    (``..``, absolute) fails the load instead of being written outside it."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise errors.ModelLoadFailed(f"source {uri!r}: object key {relative[:120]!r} is not a path inside the prefix")
    return "/".join(parts)


def _download(client: Any, uri: str, bucket: str, obj: _Object, folder: Path, progress: Progress,
              deadline: float, endpoint: str) -> None:
    target = folder / obj.relative
    target.parent.mkdir(parents=True, exist_ok=True)
    md5_match = _MD5_ETAG.match(obj.etag)
    digest = hashlib.md5(usedforsecurity=False) if md5_match else None
    written = 0
    try:
        answer = client.get_object(Bucket=bucket, Key=obj.key, IfMatch=obj.etag)
        body = answer["Body"]
        with open(target, "wb") as out:
            for chunk in body.iter_chunks(CHUNK_BYTES):
                if time.monotonic() > deadline:
                    raise errors.ModelLoadFailed(
                        f"source {uri!r}: the load's deadline passed while downloading object {obj.key!r} "
                        f"({written} of {obj.size} bytes); nothing was kept")
                out.write(chunk)
                written += len(chunk)
                progress.add(len(chunk))
                if digest is not None:
                    digest.update(chunk)
    except errors.HotsetError:
        raise
    except OSError:
        raise  # the disk (ENOSPC is the cache's to explain)
    except Exception as exc:  # noqa: BLE001
        raise _explain(exc, uri, endpoint, bucket, obj.key, written=written, size=obj.size, etag=obj.etag) from exc
    if written != obj.size:
        raise errors.ModelLoadFailed(f"source {uri!r}: object {obj.key!r} was truncated: {written} of {obj.size} "
                                     "bytes arrived; nothing was kept")
    if digest is not None and md5_match is not None and digest.hexdigest() != md5_match.group(1):
        raise errors.ModelLoadFailed(f"source {uri!r}: object {obj.key!r} does not match its ETag (MD5 "
                                     f"{digest.hexdigest()} != {md5_match.group(1)}); nothing was kept")


def _explain(exc: Exception, uri: str, endpoint: str, bucket: str, key: str, written: int = 0,
             size: int = 0, etag: str = "") -> errors.ModelLoadFailed:
    """A boto3/botocore failure as a load failure that names the URI, the object and the check."""
    from botocore.exceptions import ClientError, EndpointConnectionError, IncompleteReadError, ResponseStreamingError

    where = f"source {uri!r} (bucket {bucket!r} at {endpoint})"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        message = str(exc.response.get("Error", {}).get("Message", ""))[:200]
        if code == "NoSuchBucket":
            return errors.ModelLoadFailed(f"{where}: the bucket does not exist")
        if code in ("NoSuchKey", "404", "NotFound"):
            return errors.ModelLoadFailed(f"{where}: object {key!r} does not exist")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken",
                    "ExpiredToken", "AllAccessDisabled"):
            return errors.ModelLoadFailed(f"{where}: access to {key!r} was refused ({code}: {message}); check the "
                                          "credentials in the Secret that source.secretName names")
        if code in ("PreconditionFailed", "412"):  # If-Match on the listed ETag refused
            return errors.ModelLoadFailed(f"{where}: object {key!r} changed while the source was being downloaded "
                                          f"(its ETag is no longer the listed {etag}); nothing was kept, and the next "
                                          "load fetches the new version")
        return errors.ModelLoadFailed(f"{where}: {code or 'error'} on {key!r}: {message}")
    if isinstance(exc, (IncompleteReadError, ResponseStreamingError)):
        return errors.ModelLoadFailed(f"{where}: the download of {key!r} was interrupted after {written} of {size} "
                                      "bytes; nothing was kept")
    if isinstance(exc, EndpointConnectionError):
        return errors.ModelLoadFailed(f"{where}: cannot connect to the endpoint")
    return errors.ModelLoadFailed(f"{where}: {type(exc).__name__} on {key!r}: {str(exc)[:200]}")
