"""Image layers applied to a model's folder: in order, whiteouts honoured, nothing reaching outside."""
from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from hotset_common import errors
from hotset_worker.sources import oci_layers

URI = "oci://registry.example.com/models/m:1"


def _layer(path: Path, *members: tuple[str, str, bytes | str]) -> Path:
    """(kind 'file' | 'symlink' | 'hardlink' | 'dir', name, data or link target) members."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))  # type: ignore[arg-type]
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE}[kind]
            info.linkname = str(data)
            tar.addfile(info)
    return path


def test_layers_apply_in_order_with_whiteouts(tmp_path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    oci_layers.apply(URI, _layer(tmp_path / "1.tgz", ("file", "config.json", b"{}"), ("file", "old/a", b"a"),
                                 ("file", "stale.bin", b"x"), ("symlink", "current", "old/a")), root, "sha256:1")
    oci_layers.apply(URI, _layer(tmp_path / "2.tgz", ("file", ".wh.stale.bin", b""), ("file", "old/.wh..wh..opq", b""),
                                 ("file", "old/b", b"b"), ("hardlink", "same.json", "config.json")), root, "sha256:2")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "config.json", "current", "old", "old/b", "same.json"]
    assert (root / "same.json").read_bytes() == b"{}"


@pytest.mark.parametrize(("member", "named"), [
    (("file", "../escape", b"no"), r"'\.\./escape' would be written outside"),
    (("file", "/etc/passwd", b"no"), r"'/etc/passwd' would be written outside"),
    (("symlink", "up", "../.."), r"entry 'up' is a link to '\.\./\.\.', outside"),
    (("symlink", "abs", "/etc"), r"entry 'abs' is a link to '/etc', outside"),
    (("hardlink", "h", "/etc/passwd"), r"'/etc/passwd' would be written outside"),
])
def test_entries_reaching_outside_are_refused_naming_them(tmp_path, member, named) -> None:
    root = tmp_path / "model"
    root.mkdir()
    with pytest.raises(errors.ModelLoadFailed) as failure:
        oci_layers.apply(URI, _layer(tmp_path / "l.tgz", member), root, "sha256:1")
    assert URI in str(failure.value) and re.search(named, str(failure.value)), str(failure.value)
    assert not (tmp_path / "escape").exists()


def test_a_link_through_an_earlier_link_is_checked_where_it_really_lands(tmp_path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    layer = _layer(tmp_path / "l.tgz", ("symlink", "here", "."), ("symlink", "here/out", "../secret"))
    with pytest.raises(errors.ModelLoadFailed, match="entry 'here/out' is a link to '../secret', outside"):
        oci_layers.apply(URI, layer, root, "sha256:1")
