"""kopf handlers: thin glue from the cluster's events to the operator's parts.

- ``indexes.py``: what kopf keeps in memory (``@kopf.index``): ModelQuotas,
  WorkerPools, worker pods, the Deployments the operator made;
- ``changes.py``: one ``@kopf.on.event`` per watched kind, telling the
  controller what changed (ServedModels are kept by the controller itself,
  ``served.py``; no handler does the work, and none writes);
- ``lifecycle.py``: login, startup (the controller and its catalog feed) and cleanup.

No ServedModel has a timer, a per-object handler or a finalizer: what one
model's change costs is that model's share of one reconciliation pass
(``reconciler.py``), and deleting a model never waits for the operator.
Handlers are registered on a registry built with the operator's settings, so
nothing is read from the environment here.
"""
from __future__ import annotations

import kopf

from hotset_operator.config import OperatorConfig
from hotset_operator.handlers import changes, indexes, lifecycle
from hotset_operator.metrics import OperatorMetrics

# Older operators put this finalizer on every ServedModel; kopf removes it from them now that no
# handler needs one (settings.persistence.finalizer names it).
FINALIZER = "hotset.io/unload-copies"


def build_registry(config: OperatorConfig, metrics: OperatorMetrics | None = None) -> kopf.OperatorRegistry:
    """All handlers, bound to `config`; main() and the tests run kopf with this registry."""
    registry = kopf.OperatorRegistry()
    indexes.register(registry)
    changes.register(registry)
    lifecycle.register(registry, config, metrics or OperatorMetrics(), FINALIZER)
    return registry
