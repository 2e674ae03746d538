"""What every scheme's module hands the fetcher: a plan of what to download and how.

Planning asks the remote side what the source is now (an S3 listing, a hub
commit, an archive's declared sha256) without downloading it, so the cache can
tell a hit from a miss by content before any byte moves.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from hotset_worker.sources.cache import Fill


@dataclass(frozen=True)
class SourceSettings:
    """The pool's defaults for remote sources (worker options; the chart's workers.sources)."""

    s3_endpoint: str = ""  # empty: each scheme's public endpoint
    s3_region: str = ""
    s3_path_style: bool = True  # most S3-compatible servers want the bucket in the path
    hf_endpoint: str = ""  # a hub mirror; empty: the public hub
    oci_root: Path = Path("/mnt/oci")  # where the operator mounts oci:// image volumes
    oci_image_volumes: bool = True  # False: the worker pulls oci:// sources into its cache (oci_pull)
    oci_plain_http: tuple[str, ...] = ()  # registries (host:port) pulled over plain http: the policy's http:// entries


@dataclass(frozen=True)
class FetchPlan:
    key: str  # the cache key: a hash of what decides the bytes
    total_bytes: int
    fill: Fill  # writes the source's files into a folder, checking each
    scheme: str
    describe: str = ""


def content_key(*parts: str) -> str:
    """A cache key from what decides a source's bytes (never from secrets)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:40]
