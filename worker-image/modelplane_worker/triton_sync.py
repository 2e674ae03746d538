"""Keeps the worker's table of triton copies true to what the sidecar holds.

A Triton sidecar whose container restarted comes back empty, while the
manager still lists its triton models as READY: requests would fail and
``/status`` would say the models are here. Every ``interval_s`` (only while
some triton copy is READY) the sidecar's repository index is compared with
the table, and copies Triton no longer holds are dropped, so the next
request, or the pinned loader, loads them again. A sidecar that does not
answer proves nothing (it may come back with its models); while it is down
the pod and its triton models are unready anyway.
"""
from __future__ import annotations

import asyncio
import logging

from modelplane_common.spec import Framework
from modelplane_worker.manager import ModelManager
from modelplane_worker.triton_health import TritonHealth

log = logging.getLogger(__name__)


async def forget_lost_models(manager: ModelManager, triton: TritonHealth) -> list[str]:
    """One comparison now; the ids dropped."""
    return await manager.forget_lost_copies(Framework.TRITON, triton.held_models)


async def keep_in_sync(manager: ModelManager, triton: TritonHealth, interval_s: float = 1.0) -> None:
    """Forever: compare and drop, every `interval_s`."""
    while True:
        try:
            await forget_lost_models(manager, triton)
        except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
            log.exception("comparing the Triton sidecar's models with the table failed")
        await asyncio.sleep(interval_s)
