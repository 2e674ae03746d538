"""Placement through the router on real workers of known budgets: best fit, then the cheapest eviction."""
from __future__ import annotations

import httpx

from gateway_helpers import worker_models, write_ballast_store


def predict(router_url: str, model: str) -> None:
    response = httpx.post(f"{router_url}/predict", json={"model_id": model, "input_data": [1]}, timeout=60)
    assert response.status_code == 200, response.text


def test_new_models_fill_the_best_fitting_pod_and_evict_where_it_costs_least(procs, tmp_path):
    store = write_ballast_store(tmp_path, {"small": {"mib": 20}, "mid": {"mib": 40}, "big": {"mib": 60}, "huge": {"mib": 45}})
    # Admission control off: here every placement must stick (it may keep huge out otherwise).
    roomy, tight = procs.workers(store, ["100Mi", "50Mi"], extra=["--admission-control", "off"])
    router = procs.router([roomy, tight])

    predict(router.url, "small")  # fits both: 80 MiB left on roomy, 30 on tight -> tight
    assert worker_models(tight.url) == {"small": "READY"} and worker_models(roomy.url) == {}

    predict(router.url, "mid")  # fits only roomy
    predict(router.url, "big")  # fits roomy exactly (60 MiB free)
    assert set(worker_models(roomy.url)) == {"mid", "big"}

    # 45 MiB fits nowhere: roomy would have to drop big (60 MiB), tight only small (20 MiB); both cost
    # one equally quick reload, so the plan that throws away fewer bytes wins.
    predict(router.url, "huge")
    assert worker_models(tight.url) == {"huge": "READY"}
    assert set(worker_models(roomy.url)) == {"mid", "big"}
