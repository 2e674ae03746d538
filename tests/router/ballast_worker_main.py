"""``hotset-worker`` whose models are ballast models: a real worker process for router tests.

The test-only ballast framework (tests/hotset_testing/ballast_framework.py)
holds real memory with exact sizes and load delays, so placement and eviction
can be asserted byte for byte, and the process starts without importing torch. Specs say ``framework: torchvision``; this
process maps that name to the ballast worker before the real main() runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hotset_testing import ballast_framework  # noqa: E402
from hotset_worker import engine, main  # noqa: E402

if __name__ == "__main__":
    engine.REGISTRY["torchvision"] = ballast_framework.BallastWorker
    main.device = lambda: "cpu"  # ballast models need no torch; skipping its import saves seconds per worker
    main.main(sys.argv[1:])
