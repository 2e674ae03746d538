"""A CPU worker pod's memory budget must fit under its container's memory limit.

On CPU pools the models live in the worker container's own memory: a budget at
or above the limit would let the kernel OOM-kill the worker before the model
manager ever evicts. The operator refuses such settings at start, naming both
Helm values; GPU pools budget GPU memory, which the container limit does not bound.
"""
from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest

from hotset_operator.config import OperatorConfig


def test_cpu_budget_at_or_above_the_limit_is_refused() -> None:
    for budget in ("2Gi", "3Gi"):
        with pytest.raises(pydantic.ValidationError) as refused:
            OperatorConfig(gpu_mode="none", pod_memory_budget=budget, worker_memory="2Gi")
        message = str(refused.value)
        assert "workers.memoryBudget" in message and "workers.resources.worker.memory (2Gi)" in message


def test_cpu_budget_below_the_limit_is_kept() -> None:
    config = OperatorConfig(gpu_mode="none", pod_memory_budget="1536Mi", worker_memory="2Gi")
    assert config.pod_memory_budget == 1536 * 2**20


def test_gpu_budget_is_not_bounded_by_the_container_limit() -> None:
    config = OperatorConfig(gpu_mode="dra", pod_memory_budget="40Gi", worker_memory="24Gi")
    assert config.pod_memory_budget == 40 * 2**30


def test_the_operator_exits_with_the_reason_instead_of_starting() -> None:
    env = {"HOTSET_OPERATOR_GPUS_PER_POD": "0", "HOTSET_OPERATOR_POD_MEMORY_BUDGET": "4Gi",
           "HOTSET_OPERATOR_WORKER_MEMORY": "2Gi", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", "from hotset_operator.main import main; main([])"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "invalid settings" in done.stderr and "workers.memoryBudget (4.0Gi)" in done.stderr
