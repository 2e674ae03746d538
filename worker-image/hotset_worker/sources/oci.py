"""``oci://registry/repo:tag`` (or ``@sha256:...``): a model packaged as an OCI image or artifact.

Where the cluster supports image volumes (Kubernetes' ImageVolume), the
operator mounts each oci:// source of a pool read-only into both containers
at ``<oci root>/<oci_mount_name>``, and the kubelet pulls it once per node
(its image store is the node cache, by digest). The model's files are the
image's root. Nothing is downloaded here, and Triton reads the files in
place.
"""
from __future__ import annotations

from pathlib import Path

from hotset_common import errors
from hotset_common.sources import OciImage, oci_mount_name
from hotset_worker.sources.plan import SourceSettings


def mount_path(image: OciImage, settings: SourceSettings) -> Path:
    return settings.oci_root / oci_mount_name(image)


def folder(uri: str, image: OciImage, settings: SourceSettings) -> Path:
    path = mount_path(image, settings)
    if not path.is_dir():
        raise errors.ModelLoadFailed(
            f"source {uri!r}: image {image.reference} is not mounted in this pod (expected an image volume at "
            f"{path}); the operator mounts oci:// sources where workers.sources.oci.imageVolumes is on")
    if not any(path.iterdir()):
        raise errors.ModelLoadFailed(f"source {uri!r}: image {image.reference} mounted at {path} holds no files")
    return path
