"""An OCI image's layers applied to a folder, the way a container runtime would, but only inside it.

A pulled oci:// image's root is the model's folder, so each layer (a tar,
gzip-compressed or not) is applied in manifest order. A layer comes from
whoever can push to the registry, so nothing in it may reach outside the
folder: an absolute name or ``..`` fails the load naming the entry (through
``archive.inside``, the rule archives follow), a symbolic link must point at
a path inside the folder and a hard link at a member already written,
and devices and FIFOs are refused. Whiteouts are handled as the OCI image
spec defines them: ``.wh.<name>`` removes ``<name>`` written by an earlier
layer, ``.wh..wh..opq`` empties its folder of what earlier layers wrote.
"""
from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from hotset_common import errors
from hotset_worker.sources.archive import CHUNK_BYTES, inside

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def apply(uri: str, layer: Path, folder: Path, digest: str) -> None:
    """Unpack the tar (or tar+gzip) `layer` over `folder`; a load failure naming the entry it refuses."""
    try:
        with tarfile.open(layer, "r:*") as archive:
            for member in archive:
                _apply_member(uri, archive, member, folder, digest)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {digest} is not a tar archive "
                                     f"({type(exc).__name__}: {exc})") from exc


def _apply_member(uri: str, archive: tarfile.TarFile, member: tarfile.TarInfo, folder: Path, digest: str) -> None:
    name = member.name
    target = inside(uri, folder, name) if name.strip("/.") else folder
    base = PurePosixPath(name).name
    if base == OPAQUE:
        _empty(target.parent)
    elif base.startswith(WHITEOUT):
        _remove(target.with_name(base[len(WHITEOUT):]))
    elif member.isdir():
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            _remove(target)
        target.mkdir(parents=True, exist_ok=True)
    elif member.isfile():
        _replace(target)
        source = archive.extractfile(member)
        assert source is not None
        with source, open(target, "wb") as out:
            while chunk := source.read(CHUNK_BYTES):
                out.write(chunk)
    elif member.issym():
        _replace(target)
        _refuse_escape(uri, folder, target, member, digest)
        os.symlink(member.linkname, target)
    elif member.islnk():
        linked = inside(uri, folder, member.linkname)
        if not linked.is_file() or linked.is_symlink():
            raise errors.ModelLoadFailed(f"source {uri!r}: layer {digest} entry {name[:120]!r} is a hard link to "
                                         f"{member.linkname[:120]!r}, which no earlier entry wrote as a file")
        _replace(target)
        os.link(linked, target)
    else:
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {digest} entry {name[:120]!r} is a device or FIFO; "
                                     "only files, folders and links inside the model's folder are unpacked")


def _refuse_escape(uri: str, folder: Path, target: Path, member: tarfile.TarInfo, digest: str) -> None:
    """A symbolic link must point inside the folder from where it really is (its parent resolved,
    through links written before it, each checked the same way when it was written)."""
    root = os.path.realpath(folder)
    pointed = posixpath.normpath(posixpath.join(os.path.realpath(target.parent), member.linkname))
    if member.linkname.startswith("/") or not (pointed == root or pointed.startswith(root + os.sep)):
        raise errors.ModelLoadFailed(f"source {uri!r}: layer {digest} entry {member.name[:120]!r} is a link to "
                                     f"{member.linkname[:120]!r}, outside the model's folder; refused")


def _replace(target: Path) -> None:
    """Make room for a new entry at `target`: its parents as folders, whatever was there gone."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        _remove(target)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _empty(folder: Path) -> None:
    if folder.is_dir() and not folder.is_symlink():
        for child in folder.iterdir():
            _remove(child)
