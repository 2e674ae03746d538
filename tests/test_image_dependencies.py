"""Each image installs what its code imports.

The images install the project's dependencies plus their extras (Dockerfile.worker: ``worker``;
Dockerfile.operator, which runs the operator and the router: ``operator,router``). A module that
imports a package only another extra brings works in the test venv, which has them all, and fails
in its image: the worker once imported ``jwt`` while PyJWT came only with the router's extra, and
every worker answered 500 on the kind tier. This reads every import in each image's packages
(lazy ones in functions too) and checks that an installed distribution the image's requirements
bring (with what they require in turn) provides it.
"""
from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Imported where present, never required: engines in their own venvs, and what a module guards
# with ImportError for another platform.
OPTIONAL = {"vllm", "uvloop", "pytriton", "triton", "torch_xla", "habana_frameworks", "intel_extension_for_pytorch"}
# image -> (its extras, the packages it runs, imports in them that code it never runs makes).
IMAGES = {
    # hotset_common.worker_identity's TokenReview is the router's and the operator's, never the worker's.
    "worker": (("worker",), ("common/hotset_common", "worker-image/hotset_worker"), {"kubernetes"}),
    "operator": (("operator", "router"), ("common/hotset_common", "operator/hotset_operator", "router/hotset_router"),
                 set()),
}


def _closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` bring, transitively, as installed here (markers honoured)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for sub in requires:
            parsed = Requirement(sub)
            if parsed.marker is None or parsed.marker.evaluate({"extra": ""}) or any(
                    parsed.marker.evaluate({"extra": e}) for e in req.extras):
                todo.append(sub)
    return {key.split("[")[0] for key in seen}


def _imports(folders: tuple[str, ...]) -> dict[str, str]:
    """Top-level names every module of `folders` imports -> one file that does."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_import_of_an_image_comes_with_its_requirements(image: str):
    extras, folders, unused = IMAGES[image]
    requirements = PROJECT["dependencies"] + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    brought = _closure(requirements)
    providers = metadata.packages_distributions()
    missing = []
    for module, where in sorted(_imports(folders).items()):
        if module in sys.stdlib_module_names or module.startswith("hotset_") or module in OPTIONAL | unused:
            continue
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])}
        if not dists & brought:
            missing.append(f"{module} (imported by {where}; from {sorted(dists) or 'nothing installed'})")
    assert not missing, f"the {image} image's requirements do not bring: " + "; ".join(missing)
