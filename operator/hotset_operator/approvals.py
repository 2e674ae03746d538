"""Approvals checked against the API server's RBAC: a SubjectAccessReview per approval asked for.

A ServedModel waiting for approval (``approval.py``) whose annotations approve its current
generation is checked once: may the identity they name ``update`` ``servedmodels/approval`` in its
namespace? The review runs on a thread, never on the event loop, and its verdict is remembered
per (object, generation, identity), so a model's later events cost nothing; a refusal is an
Event on the model naming the identity and the authorizer's reason. What a granted approval
writes (``status.approval``, ``status.history``) is part of the model's status
(``model_status.py``), written with the rest of it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from hotset_operator import approval
from hotset_operator.dedicated import model_ref
from hotset_operator.index import Key, ModelEntry
from hotset_operator.kube import Kube
from hotset_operator.writes import Writes

log = logging.getLogger(__name__)
RETRY_S = 2.0  # after the API server failed to answer a review

Asked = tuple[Key, str, int, approval.Request]  # (object, uid, generation, the approval asked for)


class Approvals:
    def __init__(self, kube_api: Kube, writes: Writes, on_checked: Callable[[Key], None]) -> None:
        self.kube = kube_api
        self.writes = writes
        self.on_checked = on_checked  # the model is reconciled again with the verdict
        self._verdicts: dict[Asked, bool | None] = {}  # None: being checked
        self._tasks: set[asyncio.Task[None]] = set()

    def granted(self, entry: ModelEntry) -> approval.Request | None:
        """The approval of `entry`'s current generation its annotations ask for, once the API server
        says its identity may give it; None until then (the check starts on the first call)."""
        request = entry.approval_request
        if request is None or request.generation != entry.generation:
            return None
        asked = (entry.key, entry.uid, entry.generation, request)
        if asked not in self._verdicts:
            self._verdicts[asked] = None
            task = asyncio.get_running_loop().create_task(self._check(entry, asked))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return request if self._verdicts[asked] else None

    def forget(self, key: Key) -> None:
        """The object is gone or being deleted: its verdicts with it."""
        for asked in [a for a in self._verdicts if a[0] == key]:
            del self._verdicts[asked]

    async def _check(self, entry: ModelEntry, asked: Asked) -> None:
        request = asked[3]
        try:
            allowed, reason = await asyncio.to_thread(
                self.kube.may_approve, entry.namespace, entry.name, request.user, request.groups)
        except Exception as exc:  # noqa: BLE001 - the API server did not answer: asked again later
            log.warning("checking the approval of %s/%s by %s failed (%s); retrying", entry.namespace, entry.name,
                        request.user, exc)
            await asyncio.sleep(RETRY_S)
            self._verdicts.pop(asked, None)
            self.on_checked(entry.key)
            return
        if asked not in self._verdicts:
            return  # forgotten meanwhile
        self._verdicts[asked] = allowed
        if not allowed:
            self.writes.event(model_ref(entry), "Warning", "ApprovalRefused", (
                f"generation {request.generation} is not approved: {request.user} may not update "
                f"servedmodels/approval in namespace {entry.namespace}" + (f" ({reason})" if reason else "")))
        self.on_checked(entry.key)
