"""Model sources resolve to local folders, never outside their volume."""
from __future__ import annotations

from pathlib import Path

import pytest

from hotset_common import errors
from hotset_worker.frameworks import sources


def test_file_uri_resolves_to_the_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert sources.resolve(f"file://{tmp_path}/m", {}, None) == tmp_path / "m"


def test_pvc_uri_maps_the_claim_to_its_mount(tmp_path: Path) -> None:
    (tmp_path / "vol" / "team" / "sentiment").mkdir(parents=True)
    path = sources.resolve("pvc://models/team/sentiment", {"models": tmp_path / "vol"}, None)
    assert path == (tmp_path / "vol" / "team" / "sentiment").resolve()


@pytest.mark.parametrize("uri", ["pvc://models/../etc", "pvc://models/a/../../x", "file:///srv/../etc/passwd"])
def test_traversal_is_refused(tmp_path: Path, uri: str) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=r"\.\."):
        sources.resolve(uri, {"models": tmp_path}, None)


def test_a_symlink_out_of_the_volume_is_refused(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (tmp_path / "secret").mkdir()
    (volume / "escape").symlink_to(tmp_path / "secret")
    with pytest.raises(errors.ModelLoadFailed, match="outside its volume"):
        sources.resolve("pvc://models/escape", {"models": volume}, None)


def test_missing_path_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=str(tmp_path / "nothing-here")):
        sources.resolve(f"file://{tmp_path}/nothing-here", {}, None)


def test_an_unmounted_claim_names_the_claim_and_what_is_mounted(tmp_path: Path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=r"'other'.*mounted: models"):
        sources.resolve("pvc://other/x", {"models": tmp_path}, None)


@pytest.mark.parametrize("uri", ["s3://bucket/model", "file://relative/path", "no-scheme"])
def test_unsupported_or_relative_sources_are_refused(uri: str) -> None:
    with pytest.raises(errors.ModelLoadFailed):
        sources.resolve(uri, {}, None)
