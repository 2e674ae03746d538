"""Measure what a model occupies and give memory back after an unload.

Freeing a model in Python is not enough: the bytes stay in the allocator
(glibc's heap on CPU, torch's caching allocator on CUDA) and the pod still
looks full. ``release()`` collects the garbage and hands those bytes back, so
the budget the manager keeps matches what the OS and the GPU see.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Any

import psutil


def process_rss_bytes() -> int:
    """Resident memory of this process now."""
    return psutil.Process().memory_info().rss


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


def cuda_allocated_bytes() -> int:
    """Bytes torch's CUDA allocator holds for tensors now; 0 without CUDA."""
    torch = _torch_if_loaded()
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_allocated())


def release() -> None:
    """Return freed memory to the OS / the GPU after the last reference to a model is gone."""
    gc.collect()
    torch = _torch_if_loaded()
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    _malloc_trim()


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
