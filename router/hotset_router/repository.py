"""The OIP v2 repository at the router, one for its HTTP routes and its gRPC gateway: the models a
caller may see with where their copies are (``GET /models``, the repository index), and the admin
token that load and unload need (they place and drop copies cluster-wide)."""
from __future__ import annotations

from typing import Any, Mapping

from hotset_common import http, wire
from hotset_common.errors import Forbidden
from hotset_common.wire import CopyState
from hotset_router.service import RouterService


def check_admin(headers: Mapping[str, str], admin_token: str | None) -> None:
    """Load and unload: 403 on a router started without ``--admin-token``, 401 without that token."""
    if not admin_token:
        raise Forbidden("load and unload are disabled on this router: start it with --admin-token to allow them")
    http.check_bearer(headers, admin_token, "load and unload (the admin token)")


async def models_report(service: RouterService, headers: Any) -> wire.RouterModelsResponse:
    """``GET /models``: the seed's ``{id: metadata}`` and ``{id: name}`` for the cluster (the models
    this request may see: callers.py), plus where each model's copies live."""
    model_map = service.model_map
    shown = set(await service.callers.visible(headers, model_map.known_models()))
    copies: dict[str, list[wire.CopyLocation]] = {}
    for pod in model_map.pods():
        for copy in pod.copies.values():
            if copy.model in shown:
                copies.setdefault(copy.model, []).append(
                    wire.CopyLocation(pod=pod.name, url=pod.url, state=copy.state.value, bytes=copy.bytes))
    available = {model: service.sync.catalog.metadata(model) for model in sorted(shown)}
    loaded = {model: available[model].name if model in available else model
              for model, located in sorted(copies.items()) if any(c.state == CopyState.READY.value for c in located)}
    return wire.RouterModelsResponse(available_models=available, loaded_models=loaded, copies=copies)


def index_rows(report: wire.RouterModelsResponse) -> list[dict[str, Any]]:
    """The repository index (Triton's rows): each model READY where a copy is, LOADING while one
    loads, else UNAVAILABLE; with the pods holding ready copies."""
    rows = []
    for model in report.available_models:
        copies = report.copies.get(model, [])
        state = "READY" if model in report.loaded_models else ("LOADING" if copies else "UNAVAILABLE")
        rows.append({"name": model, "state": state, "reason": "",
                     "pods": [c.pod for c in copies if c.state == CopyState.READY.value]})
    return rows
