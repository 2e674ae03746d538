"""Where the chart is and what the e2e tier names its release.

The kind tier installs it as a user does, with ``helm upgrade --install``
(e2e/kind/platform_kind.py); re-installing with other values (a bigger pool,
another memory budget, a new worker image) is ``helm upgrade`` again.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hotset"
RELEASE = "hotset"
