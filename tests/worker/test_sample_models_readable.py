"""Sample model folders are readable by any user: worker containers run as uid 1000.

The kind tier found it: transformers' safetensors writer leaves model.safetensors
mode 0600, so a worker pod (non-root) could not read a sample built by root.
"""
from __future__ import annotations

import stat
from pathlib import Path

from hotset_worker import samples


def test_share_opens_private_files_and_folders_to_every_reader(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "1").mkdir(parents=True)
    weights = folder / "1" / "model.safetensors"
    weights.write_bytes(b"weights")
    weights.chmod(0o600)
    (folder / "1").chmod(0o700)
    samples.share(folder)
    assert stat.S_IMODE(weights.stat().st_mode) == 0o644
    assert stat.S_IMODE((folder / "1").stat().st_mode) == 0o755


def test_generated_samples_are_world_readable(sample_store: Path) -> None:
    root = sample_store.parent
    private = [p for p in root.rglob("*") if p.is_file() and not p.stat().st_mode & stat.S_IROTH]
    assert not private, private
