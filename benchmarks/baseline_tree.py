"""An older commit's packages beside this tree's, for benchmarks that print both side by side.

A benchmark that compares itself with a baseline unpacks the baseline's packages from git (no
worktree is created) and runs its own measuring code once per tree, in a child process with that
tree's packages first on its path, so each side imports its own code and nothing else.

The figures docs/benchmarks.md records for issue 17 were measured beside d516879, a commit of the
project's history from before it was renamed hotset; that history is not in this repository, so
no benchmark defaults to it. ``--baseline REF`` measures beside any commit this clone has.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def present(ref: str) -> bool:
    """Whether this clone has commit `ref`."""
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}^{{commit}}"],
                          capture_output=True).returncode == 0


def unpack(ref: str, folder: Path, *packages: str) -> Path:
    """The folders `packages` (e.g. "common", "router") of commit `ref`, under `folder`."""
    if not present(ref):
        raise SystemExit(f"--baseline {ref}: no such commit in this clone (benchmarks/baseline_tree.py)")
    tree = folder / f"tree-{ref}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *packages], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def measure_in(tree: Path, packages: tuple[str, ...], script: str, *argv: str) -> dict[str, Any]:
    """Run `script --inside argv` with `tree`'s `packages` first on the path; its last line's JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / package) for package in packages)}
    out = subprocess.run([sys.executable, script, "--inside", *argv], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])
