"""Measure what a model occupies and give memory back after an unload, without stopping the world.

Freeing a model in Python is not enough: the bytes stay in the allocator
(glibc's heap on CPU, torch's caching allocator on CUDA) and the pod still
looks full. ``release()`` hands those bytes back, so the budget the manager
keeps matches what the OS and the GPU see.

It never runs a full garbage collection: reference counting frees a model's
tensors the moment its last reference goes, and a full ``gc.collect()`` in a
process that has imported torch and transformers scans some 400k objects for
about 200 ms while holding the GIL, pausing every request of every model. A
framework worker passes a weak reference to what it dropped; only if that is
still alive (a reference cycle holds it) is a collection scheduled, on a
background thread, at most once per ``COLLECT_INTERVAL_S``, and cheap because
``freeze_imports()`` moved the import-time objects out of the collector's way.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import threading
import weakref
from typing import Any, Iterable

import psutil


def process_rss_bytes() -> int:
    """Resident memory of this process now."""
    return psutil.Process().memory_info().rss


def process_tree_bytes(pid: int) -> int:
    """Memory a process and every process under it hold: the sum of their proportional set sizes
    (shared pages counted once across them), resident size where PSS cannot be read; 0 when the
    process is gone. What a server of several processes (a vLLM engine) costs its host."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.Error, AttributeError):
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
    return total


def module_bytes(module: Any) -> int:
    """Bytes held by a torch module's parameters and buffers (deterministic, unlike RSS)."""
    tensors = list(module.parameters()) + list(module.buffers())
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        key = tensor.data_ptr()
        if key in seen:  # tied weights share storage
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


# What a GPU holds besides the models' weights, reserved once per device before the model budget:
# the CUDA context and kernel images (300-600 MB on current GPUs and drivers), cuBLAS/cuDNN
# workspaces, the caching allocator's fragmentation, and the activations of running requests.
GPU_FIXED_RESERVE = 2**30
GPU_RESERVE_SHARE = 0.10


def gpu_reserve_bytes(total: int) -> int:
    """The default reserve of a GPU of `total` bytes: 1 GiB plus 10% (8 GiB: 1.8 GiB; 80 GiB: 9 GiB)."""
    return GPU_FIXED_RESERVE + int(total * GPU_RESERVE_SHARE)


def gpu_model_budget(total: int, asked: int | None, reserve: int | None = None) -> tuple[int, str]:
    """The model budget of a GPU of `total` bytes: `asked` (None: all there is) at most `total` less
    the reserve (None: ``gpu_reserve_bytes``); and, when `asked` had to be cut, why (for the log).
    90% of the device, the old default, left 0.8 GiB of an 8 GiB GPU for everything else: the first
    large batch ran out of memory."""
    room = max(0, total - (gpu_reserve_bytes(total) if reserve is None else reserve))
    if asked is None or asked <= room:
        return (room if asked is None else asked), ""
    from hotset_common.quantity import format_bytes

    return room, (f"memory budget {format_bytes(asked)} does not fit this GPU: {format_bytes(total)} less the "
                  f"reserve for the CUDA context, workspaces and allocator slack ({format_bytes(total - room)}) "
                  f"leaves {format_bytes(room)}; using that (set --gpu-reserve to change the reserve)")


def cuda_allocated_bytes() -> int:
    """Bytes torch's CUDA allocator holds for tensors now; 0 without CUDA."""
    torch = _torch_if_loaded()
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_allocated())


class ActivationPeak:
    """How far torch's CUDA allocator rose above its level at the start while a block ran (a
    copy's warm-up: its activation peak, which its weights do not show). The allocator's peak
    statistic is device-wide, so measurements take turns (a lock: warm-ups are short) and requests
    running meanwhile can only raise it: an upper bound. ``bytes`` is 0 without CUDA."""

    _turn = threading.Lock()

    def __init__(self) -> None:
        self.bytes = 0
        torch = _torch_if_loaded()
        self._torch = torch if torch is not None and torch.cuda.is_available() else None

    def __enter__(self) -> "ActivationPeak":
        if self._torch is not None:
            self._turn.acquire()
            self._torch.cuda.synchronize()
            self._start = int(self._torch.cuda.memory_allocated())
            self._torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._torch is None:
            return
        try:
            self._torch.cuda.synchronize()
            self.bytes = max(0, int(self._torch.cuda.max_memory_allocated()) - self._start)
        finally:
            self._turn.release()


def release(dropped: Iterable[weakref.ref] = ()) -> None:
    """Return freed memory to the OS / the GPU after the last references to a model were dropped.

    `dropped`: weak references to what was dropped; any still alive is held by a
    reference cycle and gets a deferred, rate-limited collection (never one here)."""
    if any(ref() is not None for ref in dropped):
        _collector.schedule()
    _return_to_allocators()


def freeze_imports() -> None:
    """Collect once, then move every object alive now (imports: torch, transformers) to the
    permanent generation, so later collections, automatic or deferred, skip them. Called once
    a framework is prepared, before it serves."""
    gc.collect()
    gc.freeze()


def _return_to_allocators() -> None:
    torch = _torch_if_loaded()
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    _malloc_trim()


class _DeferredCollector:
    """One full collection at a time, at most every `interval_s`, on its own thread."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.collections = 0
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def schedule(self) -> None:
        with self._lock:
            if self._timer is not None:
                return  # one is already due: it will find this garbage too
            self._timer = threading.Timer(self.interval_s, self._collect)
            self._timer.daemon = True
            self._timer.start()

    def _collect(self) -> None:
        with self._lock:
            self._timer = None
        found = gc.collect()
        self.collections += 1
        log.info("deferred collection freed %d objects held by reference cycles", found)
        _return_to_allocators()


COLLECT_INTERVAL_S = 10.0
log = logging.getLogger(__name__)
_collector = _DeferredCollector(COLLECT_INTERVAL_S)


def _torch_if_loaded() -> Any:
    """torch, if it is importable; importing memory.py must not require it."""
    try:
        import torch
    except ImportError:
        return None
    return torch


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _malloc_trim() -> bool:
    """glibc keeps freed heap pages; malloc_trim(0) returns them (no-op elsewhere)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
