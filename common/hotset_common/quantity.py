"""Kubernetes resource quantities ("600Mi", "1.5Gi", "2G") as integer bytes.

ServedModel memory is written the way Kubernetes users write memory, so the
worker, router and operator must agree on what "600Mi" means.
"""
from __future__ import annotations

import re

_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kMGTPE]i?|)\s*$")


def parse_bytes(value: str | int | float) -> int:
    """Return the byte count of a quantity; raise ValueError naming the bad value."""
    if isinstance(value, bool):
        raise ValueError(f"not a memory quantity: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"memory quantity must not be negative: {value!r}")
        return int(value)
    match = _PATTERN.match(value)
    if not match:
        raise ValueError(f"not a memory quantity: {value!r} (expected e.g. 600Mi, 2Gi, 500M or bytes)")
    number, suffix = match.groups()
    return int(float(number) * _SUFFIXES[suffix])


def format_bytes(n: int) -> str:
    """Human-readable binary size, for logs and status (e.g. '600.0Mi')."""
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.1f}{suffix}"
    return str(n)
