"""The OIP v2 repository index (Triton's shape), one for the HTTP and the gRPC APIs: every model in
the pod's store with its state and, after a failed load, why it is unavailable."""
from __future__ import annotations

from hotset_common import wire
from hotset_worker.manager import ModelManager

_INDEX_STATES = {
    wire.CopyState.READY: "READY",
    wire.CopyState.LOADING: "LOADING",
    wire.CopyState.UNLOADING: "UNLOADING",
}


def repository_entries(manager: ModelManager) -> list[dict[str, str]]:
    """Triton-shaped index: every model in the store with its state and, after a failure, why."""
    views = {view.model_id: view for view in manager.snapshot()}
    failures = manager.failures()
    entries = []
    listed = manager.store.list()
    for spec in listed:
        view = views.pop(spec.id, None)
        if view is not None:
            state, reason = _INDEX_STATES[view.state], ""
        else:
            state, reason = "UNAVAILABLE", failures.get(spec.id, "unloaded")
        entries.append({"name": spec.id, "version": spec.version, "state": state, "reason": reason})
    for view in views.values():  # still in memory, but no longer in the store
        entries.append({"name": view.model_id, "version": "", "state": _INDEX_STATES[view.state], "reason": "not in the model store"})
    return entries
