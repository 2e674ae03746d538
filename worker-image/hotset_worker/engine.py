"""The worker factory: framework name -> FrameworkWorker class.

Adding a framework is one module with one ``@register("name")`` class; the
built-in modules are imported on first use, so importing the engine does not
pull in torch.

Preparing a framework (``FrameworkWorker.prepare()``: importing torch,
transformers...) happens once, under a lock per framework, whether the pod's
start-up or a first load gets there first: two threads importing
transformers at once make one of them fail with ``ImportError: cannot import
name 'AutoModel'`` (its lazy module is not thread-safe), so a load waits for
the preparation in progress instead.
"""
from __future__ import annotations

import importlib
import threading
from typing import Callable, TypeVar

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_worker import memory
from hotset_worker.frameworks.base import FrameworkWorker, WorkerContext

REGISTRY: dict[str, type[FrameworkWorker]] = {}

# Modules that register the built-in frameworks when imported.
BUILTIN_MODULES: dict[str, str] = {
    "transformers": "hotset_worker.frameworks.transformers_worker",
    "torchvision": "hotset_worker.frameworks.torchvision_worker",
    "triton": "hotset_worker.frameworks.triton_worker",
    "vllm": "hotset_worker.frameworks.vllm_worker",
}

W = TypeVar("W", bound=type[FrameworkWorker])

_prepared: set[str] = set()
_prepare_locks: dict[str, threading.Lock] = {}
_prepare_locks_guard = threading.Lock()


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


def prepare(framework: str) -> None:
    """Prepare `framework` once; a caller arriving meanwhile waits for it. A failure is not
    remembered: the next caller tries again and sees the error itself."""
    with _prepare_locks_guard:
        lock = _prepare_locks.setdefault(framework, threading.Lock())
    with lock:
        if framework in _prepared:
            return
        worker_class(framework).prepare()
        memory.freeze_imports()  # later collections skip what the imports left (see memory.py)
        _prepared.add(framework)


def create(spec: ModelSpec, context: WorkerContext) -> FrameworkWorker:
    """A new, not yet loaded, worker for `spec`, once its framework is prepared."""
    framework = spec.framework.value if hasattr(spec.framework, "value") else str(spec.framework)
    prepare(framework)
    return worker_class(framework)(spec, context)
