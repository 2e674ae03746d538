"""What the in-process torch frameworks share: device choice, softmax rows, input checks."""
from __future__ import annotations

import logging
from typing import Any

from hotset_common import errors

log = logging.getLogger(__name__)

# One request may not ask for more rows than this (a 400, not an out-of-memory crash).
MAX_BATCH = 256


def torch_device(requested: str) -> Any:
    """The torch device to use: the requested one, falling back to CPU when CUDA is absent."""
    import torch

    if requested.startswith("cuda") and not torch.cuda.is_available():
        log.warning("device %s requested but CUDA is not available; using cpu", requested)
        return torch.device("cpu")
    if requested in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def labelled_rows(probabilities: Any, labels: list[str]) -> list[dict[str, Any]]:
    """Per row: the top label, its score, and every label's probability."""
    rows = []
    for row in probabilities.tolist():
        best = max(range(len(row)), key=row.__getitem__)
        rows.append({
            "label": labels[best],
            "score": row[best],
            "probabilities": {label: p for label, p in zip(labels, row)},
        })
    return rows


def check_batch_size(n: int, what: str) -> None:
    if n == 0:
        raise errors.BadInput(f"{what} is empty")
    if n > MAX_BATCH:
        raise errors.BadInput(f"{what} has {n} items; at most {MAX_BATCH} per request")
