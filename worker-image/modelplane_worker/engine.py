"""The worker factory: framework name -> FrameworkWorker class.

Adding a framework is one module with one ``@register("name")`` class; the
built-in modules are imported on first use, so importing the engine does not
pull in torch.
"""
from __future__ import annotations

import importlib
from typing import Callable, TypeVar

from modelplane_common import errors
from modelplane_common.spec import ModelSpec
from modelplane_worker.frameworks.base import FrameworkWorker, WorkerContext

REGISTRY: dict[str, type[FrameworkWorker]] = {}

# Modules that register the built-in frameworks when imported.
BUILTIN_MODULES: dict[str, str] = {
    "transformers": "modelplane_worker.frameworks.transformers_worker",
    "torchvision": "modelplane_worker.frameworks.torchvision_worker",
    "triton": "modelplane_worker.frameworks.triton_worker",
}

W = TypeVar("W", bound=type[FrameworkWorker])


def register(framework: str) -> Callable[[W], W]:
    """Class decorator: make `framework` models load with this worker class."""

    def _register(cls: W) -> W:
        cls.framework = framework
        REGISTRY[framework] = cls
        return cls

    return _register


def worker_class(framework: str) -> type[FrameworkWorker]:
    if framework not in REGISTRY and framework in BUILTIN_MODULES:
        importlib.import_module(BUILTIN_MODULES[framework])
    try:
        return REGISTRY[framework]
    except KeyError:
        known = sorted(set(REGISTRY) | set(BUILTIN_MODULES))
        raise errors.BadInput(f"unknown framework {framework!r}; known: {', '.join(known)}") from None


def create(spec: ModelSpec, context: WorkerContext) -> FrameworkWorker:
    """A new, not yet loaded, worker for `spec`."""
    framework = spec.framework.value if hasattr(spec.framework, "value") else str(spec.framework)
    return worker_class(framework)(spec, context)
