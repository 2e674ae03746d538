"""How a worker pod keeps its memory budget: the one setting the chart, the operator and the worker share."""
from __future__ import annotations

import enum


class BudgetMode(enum.Enum):
    """What a load on a full pod does with the copies it displaces.

    ``LOAD_FIRST``: they keep serving while it loads and are evicted once it
    succeeded, so a failed load evicts nothing; memory passes the budget by the
    new model's size meanwhile (room a CPU container's limit can give).
    ``HARD``: the budget is never passed. The load is prepared first (backend
    checked, files fetched, framework created), so the usual failures (a down
    sidecar, a missing source, an unknown framework, a Triton model the trust
    policy refuses) still evict nothing; then
    its victims are unloaded and it allocates into their room. Weights that
    fail to load after that leave the room free (the victims load again on
    their next request). ``AUTO`` is hard on a GPU, where passing the budget
    is an out-of-memory error for every model on the device, and load-first
    on a CPU.
    """

    AUTO = "auto"
    LOAD_FIRST = "load-first"
    HARD = "hard"

    def on(self, device: str) -> "BudgetMode":
        """The mode a worker on `device` ("cuda", "cpu") runs in."""
        if self is BudgetMode.AUTO:
            return BudgetMode.HARD if device == "cuda" else BudgetMode.LOAD_FIRST
        return self
