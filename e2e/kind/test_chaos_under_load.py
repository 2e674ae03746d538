"""Chaos under load on the kind tier (e2e/scenarios/chaos.py): a benchmark that prints its table, run
with HOTSET_CHAOS=1 (`HOTSET_CHAOS=1 .venv/bin/pytest -q -s e2e/kind/test_chaos_under_load.py`);
figures in docs/reliability.md. It asserts only what must hold: a dead worker or sidecar, or the
operator, costs no request of a model with two copies."""
from __future__ import annotations

import json
import os

import pytest

from scenarios import chaos

pytestmark = pytest.mark.skipif(os.environ.get("HOTSET_CHAOS") != "1",
                                reason="a benchmark (minutes): HOTSET_CHAOS=1 runs it")


def test_chaos_under_load(platform, sm_kube) -> None:
    rows = chaos.chaos_under_load(platform, sm_kube)
    print(json.dumps(rows, indent=1))
    assert all(row["failed"] == 0 for row in rows if row["killed"] != "router"), rows
