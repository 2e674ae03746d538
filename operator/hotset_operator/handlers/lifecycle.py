"""Login, startup and cleanup: kopf's settings, and the controller (``controller.py``) with its feed."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from hotset_operator import controller, kube
from hotset_operator.config import OperatorConfig
from hotset_operator.metrics import OperatorMetrics


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: no handler here reacts to a field's change. kopf builds one for every event of
    every object anyway, a deep copy of the whole body (about a third of its per-event work, and a
    ServedModel with large warm-ups copies them on each of its events)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, metrics: OperatorMetrics,
             finalizer: str) -> None:

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default login handlers: in-cluster, else $KUBECONFIG.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **indexes: Any) -> None:
        settings.persistence.finalizer = finalizer  # only so that kopf strips older operators' finalizers
        # No change handlers, so kopf stores no progress and needs no diff-base; were it to store
        # progress, not in status (the CRDs' status schemas are strict).
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="hotset.io")
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.posting.level = logging.WARNING  # our own events, not kopf's chatter
        # kopf logs every handler call at INFO; ours only forward events (ten thousand models, tens
        # of thousands of lines at a restart). Its warnings and errors still show.
        objects = logging.getLogger("kopf.objects")
        objects.setLevel(max(objects.getEffectiveLevel(), logging.WARNING))
        # Serve the namespaces named at start and the CRDs present then: no cluster-wide list/watch
        # of namespaces and CRDs.
        settings.scanning.disabled = True
        # A quiet watch stream is re-opened every 5 minutes (resuming from its resourceVersion); the
        # client gives up a little later, so a half-open connection ends too.
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        api = kube.Kube(await asyncio.to_thread(kube.connect))
        # The client's API modules take seconds to import: on a thread, while kopf lists.
        asyncio.get_running_loop().run_in_executor(None, api.warm)
        memo.controller = controller.Controller(config, api, metrics, indexes)
        await memo.controller.start()

    @kopf.on.cleanup(registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "controller", None) is not None:
            await memo.controller.stop()
