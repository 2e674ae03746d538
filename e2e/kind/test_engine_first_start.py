"""The images were built on an engine in its first start, the state of a machine that never ran Docker.

On its first start on a machine, where it creates ``docker0``, Debian's dockerd 20.10
names no gateway for its bridge; every kind-tier test once errored at set-up there
(the wheel server bound to an empty address), and passed wherever an earlier run
had left ``docker0`` behind. The engine the tier starts now takes away what it
leaves in the host's network when it stops (``host_network.py``), so each run
on a machine the tier left clean starts dockerd as a new machine does, and this
test makes sure that such a run is what CI had.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from engine import Engine
from platform_kind import KindPlatform


def test_images_built_on_a_first_start_engine(engine: Engine, platform: KindPlatform) -> None:
    required = os.environ.get("HOTSET_KIND_REQUIRED") == "1"
    if engine.pid is None:
        pytest.skip("a Docker engine already answered, so the tier did not start one")
    if not engine.first_start:
        message = "docker0 existed before the tier's engine started (left by an engine the tier did not start)"
        if required:
            pytest.fail(message + ": CI machines start without it", pytrace=False)
        pytest.skip(message)
    # The bridge dockerd made in this run, and the images built through it (the platform is installed).
    bridge = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "docker0"], capture_output=True, text=True,
                            timeout=30).stdout
    assert " inet " in bridge, f"the engine's default bridge has no IPv4 address: {bridge!r}"
    images = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                            text=True, timeout=60, check=True).stdout.split()
    assert {"hotset-operator:e2e", "hotset-worker:e2e", "hotset-triton-cpu:e2e"} <= set(images), images
