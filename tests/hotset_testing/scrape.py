"""Read one figure from a process's Prometheus ``/metrics`` (worker, router or operator)."""
from __future__ import annotations

import httpx


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples `name` at `url`/metrics whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
