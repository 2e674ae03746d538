"""One ``@kopf.on.event`` per watched kind: tell the controller what changed, nothing more.

kopf runs these only once every index is filled, and after indexing the
event's object, so the controller reads the new state from the indexes; a
ServedModel's event also carries its new state into ``served.py``. They are
``async`` and O(1): the work happens in the controller's passes.
"""
from __future__ import annotations

from typing import Any

import kopf

from hotset_operator import kinds


def register(registry: kopf.OperatorRegistry) -> None:

    @kopf.on.event(**kinds.SERVED_MODELS, registry=registry)
    async def served_model_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controller = memo.controller
        controller.models.changed(controller.served.observe(event.get("type"), body))

    @kopf.on.event(**kinds.MODEL_QUOTAS, registry=registry)
    async def quota_changed(memo: kopf.Memo, **_: Any) -> None:
        memo.controller.models.quotas_changed()

    @kopf.on.event(**kinds.WORKER_POOLS, registry=registry)
    async def pool_changed(memo: kopf.Memo, **_: Any) -> None:
        memo.controller.models.indexed()  # sized at the next pool pass; this says the indexes are full
